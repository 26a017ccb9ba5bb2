"""An engine's prefix (KV) cache over content, as vLLM's block pool keeps it (pure).

Content is a *chain* of segments, `[(segment_id, blocks), ...]`: a shared system prompt,
a document, one turn's text, one answer. A segment's identity is its id *under its
parent* (the same text after a different prefix is different KV), so the cache is a tree
of segments, and a request hits the longest cached prefix of its chain. Recorded traces
whose requests list one hash per block (Mooncake's `hash_ids`) are chains of 1-block
segments; the emulator hashes real text into 1-block segments too.

The rules are vLLM's (v1 `KVCacheManager` / `BlockPool`):
- only full blocks are cached, and a block serves hits only once it has been computed:
  a prompt's blocks at the end of its prefill, an answer's when it finishes. A request
  arriving while another is still prefilling the same prefix computes it again;
- running requests hold their blocks, shared blocks once (reference counts), plus
  private blocks for their output;
- blocks nobody holds stay cached until their memory is needed; then the least recently
  used go first, and of one chain its tail first (vLLM frees a request's blocks in
  reverse order): here, least recently used *leaf* segments give up blocks from their end;
- memory is reserved at admission for the prompt and the whole output; a request that
  does not fit waits (see `Engine`), instead of being admitted and later preempted.

Work per request is a few dictionary steps per segment, not per block, which is what
lets the simulator replay millions of requests (bench/simulator.py).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

Chain = Sequence[tuple[int, int]]  # (segment id, blocks)


_uids = itertools.count(1)


class _Node:
    __slots__ = ("cached", "children", "key", "last_used", "parent", "pins", "ready_at", "uid")

    def __init__(self, key: tuple[int, int], parent: _Node | None) -> None:
        self.uid = next(_uids)  # what children key on (0 is the root)
        self.key = key
        self.parent = parent
        self.cached = 0  # leading blocks of the segment held in memory
        self.ready_at = 0.0  # when they were (or will be) computed
        self.pins = 0  # running requests holding this segment
        self.children = 0  # child segments with blocks in memory
        self.last_used = 0.0


class Holding:
    """What one admitted request holds until `BlockCache.release`."""

    __slots__ = ("fresh", "matched_blocks", "nodes", "private_blocks")

    def __init__(self, nodes: list[_Node], fresh: list[_Node], matched: int,
                 private: int) -> None:
        self.nodes = nodes  # the prompt chain's segments, pinned
        self.fresh = fresh  # segments this request computes (their readiness is its prefill)
        self.matched_blocks = matched
        self.private_blocks = private


class BlockCache:
    """See the module doc. Times are the caller's clock (virtual or real seconds)."""

    __slots__ = ("_heap", "_nodes", "_root_children", "_seq", "capacity_blocks", "evicted_blocks",
                 "used_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1")
        self.capacity_blocks = int(capacity_blocks)
        self.used_blocks = 0  # cached segment blocks + private (output) blocks
        self.evicted_blocks = 0
        self._nodes: dict[tuple[int, int], _Node] = {}
        self._heap: list[tuple[float, int, _Node]] = []  # eviction candidates (lazy)
        self._seq = 0
        self._root_children = 0

    # --- queries -----------------------------------------------------------------------

    def match(self, chain: Chain, now: float) -> int:
        """Blocks of `chain`'s prefix that a request arriving at `now` would find cached."""
        matched, parent = 0, 0
        nodes = self._nodes
        for seg, blocks in chain:
            node = nodes.get((parent, seg))
            if node is None or node.ready_at > now or node.cached == 0:
                break
            matched += min(node.cached, blocks)
            if node.cached < blocks:
                break
            parent = node.uid
        return matched

    @property
    def cached_blocks(self) -> int:
        return sum(n.cached for n in self._nodes.values())

    def __len__(self) -> int:
        return len(self._nodes)

    # --- a request's life ----------------------------------------------------------------

    def admit(self, chain: Chain, now: float, private_blocks: int,
              limit_blocks: int | None = None) -> Holding | None:
        """Pin `chain` (caching its uncached blocks, evicting others if needed) and reserve
        `private_blocks`; None if that cannot fit beside what running requests hold (the
        caller waits for one to finish). At most `limit_blocks` count as hits (a trace that
        says how much of a prompt its predecessors share). Call `computed` once the prefill
        end is known."""
        nodes, path, fresh = self._nodes, [], []
        matched, parent, need, matching = 0, None, private_blocks, True
        for seg, blocks in chain:
            key = (parent.uid if parent is not None else 0, seg)
            node = nodes.get(key)
            if node is None:
                node = _Node(key, parent)
                need += blocks
                matching = False
                fresh.append(node)
            else:
                if matching and node.ready_at <= now and node.cached:
                    matched += min(node.cached, blocks)
                if node.cached < blocks:
                    need += blocks - node.cached
                    matching = False
                    fresh.append(node)
                elif node.ready_at > now:
                    matching = False
            path.append(node)
            parent = node
        for node in path:  # pinned first: eviction must not take this request's own prefix
            node.pins += 1
        if not self._make_room(need):
            for node in path:
                self._unpin(node, node.last_used)
            return None
        for node, (_seg, blocks) in zip(path, chain, strict=True):
            if node.cached < blocks:
                if node.cached == 0:
                    self._attach(node)
                self.used_blocks += blocks - node.cached
                node.cached = blocks
        self.used_blocks += private_blocks
        if limit_blocks is not None and matched > limit_blocks:
            matched = limit_blocks
        return Holding(path, fresh, matched, private_blocks)

    def computed(self, holding: Holding, ready_at: float) -> None:
        """The prefill of the request holding `holding` ends at `ready_at`."""
        for node in holding.fresh:
            node.ready_at = ready_at

    def release(self, holding: Holding, now: float, answer: Chain = ()) -> None:
        """The request finished at `now`: unpin its prompt, and cache `answer` (the output's
        full blocks, continuing the prompt's chain) in place of its private blocks."""
        self.used_blocks -= holding.private_blocks
        parent = holding.nodes[-1] if holding.nodes else None
        budget = holding.private_blocks
        for seg, blocks in answer:
            if blocks > budget:
                break
            budget -= blocks
            key = (parent.uid if parent is not None else 0, seg)
            node = self._nodes.get(key)
            if node is None:
                node = _Node(key, parent)
            if node.cached < blocks:
                if node.cached == 0:
                    self._attach(node)
                self.used_blocks += blocks - node.cached
                node.cached = blocks
                node.ready_at = now
            node.last_used = now
            self._candidate(node)
            parent = node
        for node in holding.nodes:
            self._unpin(node, now)

    # --- memory ----------------------------------------------------------------------------

    def _make_room(self, need: int) -> bool:
        if need > self.capacity_blocks:
            return False
        heap = self._heap
        while self.used_blocks + need > self.capacity_blocks:
            if not heap:
                return False
            last_used, _seq, node = heapq.heappop(heap)
            if (node.pins or node.children or not node.cached or last_used != node.last_used
                    or self._nodes.get(node.key) is not node):
                continue  # stale entry
            give = min(node.cached, self.used_blocks + need - self.capacity_blocks)
            node.cached -= give  # the segment's tail blocks go first
            self.used_blocks -= give
            self.evicted_blocks += give
            if node.cached == 0:
                self._detach(node)
            else:
                self._push(node)
        return True

    def _attach(self, node: _Node) -> None:
        self._nodes[node.key] = node
        if node.parent is not None:
            node.parent.children += 1
        else:
            self._root_children += 1

    def _detach(self, node: _Node) -> None:
        del self._nodes[node.key]
        parent = node.parent
        if parent is None:
            self._root_children -= 1
            return
        parent.children -= 1
        self._candidate(parent)

    def _unpin(self, node: _Node, now: float) -> None:
        node.pins -= 1
        node.last_used = now
        self._candidate(node)

    def _candidate(self, node: _Node) -> None:
        if not node.pins and not node.children and node.cached:
            self._push(node)

    def _push(self, node: _Node) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (node.last_used, self._seq, node))
        if len(self._heap) > 4 * len(self._nodes) + 1024:
            self._compact()

    def _compact(self) -> None:
        """Drop stale heap entries (each node is pushed again whenever it changes)."""
        live = [e for e in self._heap
                if not e[2].pins and not e[2].children and e[2].cached
                and e[0] == e[2].last_used and self._nodes.get(e[2].key) is e[2]]
        heapq.heapify(live)
        self._heap = live


def blocks_of(tokens: int, block_tokens: int) -> int:
    """Full blocks in `tokens` tokens."""
    return tokens // block_tokens


def ceil_blocks(tokens: int, block_tokens: int) -> int:
    return math.ceil(tokens / block_tokens)
