"""Content chains for replayed workloads: what each request's prompt *is*, in segments (pure).

A synthetic workload describes conversations: key b has a system prompt of S_b tokens; the
j-th turn of conversation c adds the user's message (u tokens), and its answer (the
output) joins the next turn's prompt. As content:

    turn j prompt = [system(b)] + [user(c,0), answer(c,0), ..., user(c,j-1), answer(c,j-1),
                                   user(c,j)]
    answer = the same conversation segment, grown by answer(c,j)

(each turn's prompt is a prefix of the next one's, so a conversation is one segment that
grows; its blocks are evicted from the end, as vLLM evicts a request's tail first)

so turns hit what earlier turns of the same conversation *computed* (an answer is cached
when its request finishes; a turn sent before that finds only what was there), and every
conversation of a key shares the key's system prompt (and keys of one `system_group` share
one system prompt's content). A length-only trace (key, prompt,
prefix tokens) has no conversations: its key is one growing stream of content, and the
trace's prefix says how much of it a request shares (`reuse limit`). A trace that records
its prompts' block hashes (Mooncake's `hash_ids`) is content already: a request's chain is
its hashes, each a segment of `hash_block_tokens` tokens (its last one what is left of the
prompt), so requests share exactly the leading blocks their hashes share, across keys too.

Segments count whole blocks (tokens // block size): the partial block at each segment's
end is not cached, as vLLM caches only full blocks (this loses at most one block per
segment, where vLLM loses one per request).
"""

from __future__ import annotations

from planner_svc.simulator.kvcache import Chain
from planner_svc.simulator.workload import Workload

_SYSTEM = 1 << 40  # segment-id spaces, so no two kinds of segment share an id
_CONVERSATION = 1 << 50
_HASHED = 1 << 60


class ChainBuilder:
    """Builds each request's chain in arrival order (conversations grow as they are seen)."""

    def __init__(self, w: Workload, block_tokens: int) -> None:
        self.w = w
        self.bs = block_tokens
        # Typed lists: compiled (setup.py), each read below is then a direct index.
        self._conv: list[int] | None = w.conv.tolist() if w.conv is not None else None
        self._system: list[int] | None = (w.system.tolist() if w.system is not None
                                          else None)
        # The system prompt segment of each key: its own, or its group's (shared content).
        groups = w.system_group
        self._system_seg: list[int] = (groups.tolist() if groups is not None
                                       else list(range(len(w.keys))))
        self._keys: list[int] = w.key.tolist()
        self._prompt: list[int] = w.prompt.tolist()
        self._prefix: list[int] = w.prefix.tolist()
        self._output: list[int] = w.output.tolist()
        self._blocks = w.blocks

    def chain(self, i: int) -> tuple[Chain, Chain, int | None]:
        """(prompt chain, answer chain, reuse limit in tokens or None) of request i."""
        bs, key = self.bs, self._keys[i]
        if self._blocks is not None:
            return self._hashed(i), (), None
        if self._conv is None or self._system is None:
            # One growing stream of content per key; the trace's prefix bounds the reuse.
            return [(_SYSTEM + key, self._prompt[i] // bs)], (), self._prefix[i]
        conv = self._conv[i]
        system = self._system[key]
        spoken = self._prompt[i] - system  # the conversation so far, this question included
        if spoken < bs:
            return ([(_SYSTEM + self._system_seg[key], system // bs)] if system >= bs
                    else []), (), None
        conv_seg = _CONVERSATION + conv
        chain = ([(_SYSTEM + self._system_seg[key], system // bs), (conv_seg, spoken // bs)]
                 if system >= bs else [(conv_seg, spoken // bs)])
        return chain, [(conv_seg, (spoken + self._output[i]) // bs)], None

    def _hashed(self, i: int) -> Chain:
        hashes, bs = self._blocks[i], self.bs  # type: ignore[index]
        per = self.w.hash_block_tokens
        left = self._prompt[i]
        chain = []
        for h in hashes:
            tokens = min(per, left)
            if tokens < bs:
                break  # a partial block is not cached
            chain.append((_HASHED + (h & ((1 << 59) - 1)), tokens // bs))
            left -= tokens
        return chain


def affine_uncached_tokens(w: Workload, block_tokens: int, n: int) -> list[int]:
    """The prompt tokens each of the first `n` requests of `w` must compute when every request
    of its key went to one destination with an unbounded cache: what a warm destination's
    prefill costs under affinity. The content-level counterpart of `prompt - prefix` (the
    trace's claim), which overstates reuse where a key's conversations do not share their
    histories (a whale's conversations share only the system prompt). An upper bound on reuse:
    an answer counts as computed by the next request of its conversation, however soon it
    comes; a full hit still computes its last block, as on the engine."""
    builder = ChainBuilder(w, block_tokens)
    computed: dict[int, int] = {}  # segment -> blocks computed
    prompts = w.prompt.tolist()
    out = []
    for i in range(min(n, len(prompts))):
        chain, answer, limit = builder.chain(i)
        blocks = 0
        for seg, k in chain:
            have = computed.get(seg, 0)
            blocks += min(have, k)
            if have < k:
                break
        if limit is not None:
            blocks = min(blocks, limit // block_tokens)
        cached = blocks * block_tokens
        if cached >= prompts[i] > 0:
            cached = max(0, cached - block_tokens)
        out.append(prompts[i] - cached)
        for seg, k in (*chain, *answer):
            if computed.get(seg, 0) < k:
                computed[seg] = k
    return out
