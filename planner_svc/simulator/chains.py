"""Content chains for replayed workloads: what each request's prompt *is*, in segments (pure).

A synthetic workload describes conversations: key b has a system prompt of S_b tokens; the
j-th turn of conversation c adds the user's message (u tokens), and its answer (the
output) joins the next turn's prompt. As content:

    turn j prompt = [system(b)] + [user(c,0), answer(c,0), ..., user(c,j-1), answer(c,j-1)]
                    + [user(c,j)]                       answer = [answer(c,j)]

so turns hit what earlier turns of the same conversation *computed* (an answer is cached
when its request finishes; a turn sent before that finds only what was there), and every
conversation of a key shares the key's system prompt. A length-only trace (key, prompt,
prefix tokens) has no conversations: its key is one growing stream of content, and the
trace's prefix says how much of it a request shares (`reuse limit`).

Segments count whole blocks (tokens // block size): the partial block at each segment's
end is not cached, as vLLM caches only full blocks (this loses at most one block per
segment, where vLLM loses one per request).
"""

from __future__ import annotations

from planner_svc.simulator.kvcache import Chain
from planner_svc.simulator.workload import Workload

_SYSTEM = 1 << 40  # segment-id spaces, so no two kinds of segment share an id


class ChainBuilder:
    """Builds each request's chain in arrival order (conversations grow as they are seen)."""

    def __init__(self, w: Workload, block_tokens: int) -> None:
        self.w = w
        self.bs = block_tokens
        self._history: dict[int, list[tuple[int, int]]] = {}  # conversation -> segments
        self._conv = w.conv.tolist() if w.conv is not None else None
        self._system = w.system.tolist() if w.system is not None else None
        self._keys = w.key.tolist()
        self._prompt = w.prompt.tolist()
        self._prefix = w.prefix.tolist()
        self._output = w.output.tolist()

    def chain(self, i: int) -> tuple[Chain, Chain, int | None]:
        """(prompt chain, answer chain, reuse limit in tokens or None) of request i."""
        bs, key = self.bs, self._keys[i]
        if self._conv is None or self._system is None:
            # One growing stream of content per key; the trace's prefix bounds the reuse.
            return [(_SYSTEM + key, self._prompt[i] // bs)], (), self._prefix[i]
        conv = self._conv[i]
        history = self._history.setdefault(conv, [])
        system = self._system[key]
        user = self._prompt[i] - self._prefix[i]
        turn = len(history) // 2
        user_seg = (conv << 12) | (2 * turn)
        answer_seg = user_seg | 1
        head = [(_SYSTEM + key, system // bs)] if system >= bs else []
        chain = [*head, *history, (user_seg, user // bs)]
        answer = [(answer_seg, self._output[i] // bs)]
        history.append((user_seg, user // bs))
        history.append(answer[0])
        return [c for c in chain if c[1] > 0], [a for a in answer if a[1] > 0], None
