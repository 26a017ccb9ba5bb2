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

An `observer` (optional) hears which blocks become cached and which are evicted, as
`block_id`s (a segment's node and the block's index in it), in the order vLLM's KV-event
publisher reports BlockStored and BlockRemoved; the emulated engines publish them so.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

Chain = Sequence[tuple[int, int]]  # (segment id, blocks)
# (block ids cached, block ids evicted), per change
Observer = Callable[[Sequence[int], Sequence[int]], None]
BLOCK_INDEX_BITS = 24


def block_id(node_uid: int, index: int) -> int:
    """A block's identity: its segment node and its index in the segment."""
    return (node_uid << BLOCK_INDEX_BITS) | index


_uids = itertools.count(1)


class _Node:
    __slots__ = ("cached", "kids", "last_used", "lru_next", "lru_prev", "parent", "pins",
                 "ready_at", "seg", "uid")

    def __init__(self, seg: int, parent: _Node | None, uid: int = -1) -> None:
        self.uid = next(_uids) if uid < 0 else uid  # its blocks' ids (block_id)
        self.seg = seg  # its id under its parent
        self.parent = parent
        # Child segments in memory, by id (empty or None: a leaf). A table per node (int
        # keys) rather than one keyed by (parent, id) saves a tuple and its hash per
        # segment looked up.
        self.kids: dict[int, _Node] | None = None
        self.cached = 0  # leading blocks of the segment held in memory
        self.ready_at = 0.0  # when they were (or will be) computed
        self.pins = 0  # running requests holding this segment
        self.last_used = 0.0
        # Its place in the cache's eviction order (`_Lru`); both None while not in it.
        self.lru_prev: _Node | None = None
        self.lru_next: _Node | None = None


class _Lru:
    """The eviction order: unpinned leaf segments with blocks in memory, least recently
    used first. A doubly linked list threaded through the nodes themselves (a sentinel
    closes the ring), so that every step is a few attribute stores; compiled, an
    `OrderedDict` cost a generic call per step, several per request."""

    __slots__ = ("head",)

    def __init__(self) -> None:
        self.head = _Node(-1, None, uid=0)  # the sentinel: head.lru_next is the oldest
        self.head.lru_next = self.head.lru_prev = self.head

    def oldest(self) -> _Node | None:
        first = self.head.lru_next
        return None if first is self.head else first

    def append(self, node: _Node) -> None:
        """Add `node` as the most recently used; a node already in it keeps its place."""
        if node.lru_next is None:
            last = self.head.lru_prev
            assert last is not None
            _link_after(last, node)

    def push_front(self, node: _Node) -> None:
        """Add `node` (or move it) as the next to evict."""
        self.discard(node)
        _link_after(self.head, node)

    def touch(self, node: _Node) -> None:
        """Add `node` (or move it) as the most recently used."""
        self.discard(node)
        self.append(node)

    def discard(self, node: _Node) -> None:
        nxt = node.lru_next
        if nxt is None:
            return
        prev = node.lru_prev
        assert prev is not None
        prev.lru_next = nxt
        nxt.lru_prev = prev
        node.lru_prev = node.lru_next = None


def _link_after(prev: _Node, node: _Node) -> None:
    after = prev.lru_next
    assert after is not None
    node.lru_prev, node.lru_next = prev, after
    after.lru_prev = node
    prev.lru_next = node


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

    __slots__ = ("_evictable", "_n_nodes", "_root", "capacity_blocks", "evicted_blocks",
                 "observer", "used_blocks")

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be >= 1")
        self.capacity_blocks = int(capacity_blocks)
        self.used_blocks = 0  # cached segment blocks + private (output) blocks
        self.evicted_blocks = 0
        self._root: dict[int, _Node] = {}  # first segments in memory, by id
        self._n_nodes = 0
        # Unpinned leaf segments with blocks in memory, least recently used first. The
        # caller's clock only moves forward, so "used last" is "appended last": no heap.
        self._evictable = _Lru()
        self.observer: Observer | None = None

    def _stored(self, node: _Node, start: int, end: int) -> None:
        if self.observer is not None and end > start:
            self.observer([block_id(node.uid, i) for i in range(start, end)], ())

    # --- queries -----------------------------------------------------------------------

    def match(self, chain: Chain, now: float) -> int:
        """Blocks of `chain`'s prefix that a request arriving at `now` would find cached."""
        matched = 0
        table: dict[int, _Node] | None = self._root
        for seg, blocks in chain:
            node = table.get(seg) if table is not None else None
            if node is None or node.ready_at > now or node.cached == 0:
                break
            matched += min(node.cached, blocks)
            if node.cached < blocks:
                break
            table = node.kids
        return matched

    @property
    def cached_blocks(self) -> int:
        total, tables = 0, [self._root]
        while tables:
            for node in tables.pop().values():
                total += node.cached
                if node.kids:
                    tables.append(node.kids)
        return total

    def __len__(self) -> int:
        return self._n_nodes

    # --- a request's life ----------------------------------------------------------------

    def admit(self, chain: Chain, now: float, private_blocks: int,
              limit_blocks: int | None = None) -> Holding | None:
        """Pin `chain` (caching its uncached blocks, evicting others if needed) and reserve
        `private_blocks`; None if that cannot fit beside what running requests hold (the
        caller waits for one to finish). At most `limit_blocks` count as hits (a trace that
        says how much of a prompt its predecessors share). Call `computed` once the prefill
        end is known."""
        table: dict[int, _Node] | None = self._root
        path: list[_Node] = []
        listed: list[_Node] = []  # of those, the ones in the eviction order (unpinned leaves)
        fresh: list[_Node] = []  # segments this request computes ...
        lengths: list[int] = []  # ... and to what length
        parent: _Node | None = None
        matched, need, matching = 0, private_blocks, True
        for seg, blocks in chain:
            node = table.get(seg) if table is not None else None
            if node is None:
                node = _Node(seg, parent)
                need += blocks
                matching = False
                fresh.append(node)
                lengths.append(blocks)
            else:
                cached = node.cached
                if matching:
                    if node.ready_at > now:
                        matching = False
                    else:
                        matched += cached if cached < blocks else blocks
                if cached < blocks:
                    need += blocks - cached
                    matching = False
                    fresh.append(node)
                    lengths.append(blocks)
            if node.pins == 0 and not node.kids and node.cached > 0:
                listed.append(node)
            node.pins += 1  # pinned first: eviction must not take this request's own prefix
            path.append(node)
            parent, table = node, node.kids
        if self.used_blocks + need > self.capacity_blocks and not self._make_room(need):
            for node in path:  # back as they were: still in the LRU order they had
                node.pins -= 1
            return None
        evictable = self._evictable
        for node in listed:
            evictable.discard(node)
        observer = self.observer
        for j, node in enumerate(fresh):
            blocks = lengths[j]
            if node.cached == 0:
                if blocks == 0:
                    continue
                self._attach(node)
            self.used_blocks += blocks - node.cached
            if observer is not None:
                self._stored(node, node.cached, blocks)
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
        full blocks, continuing the prompt's chain) in place of its private blocks. An answer
        segment with the same id as the prompt's last one *extends* it (a conversation kept
        as one growing segment: each turn's prompt is a prefix of the next one's)."""
        self.used_blocks -= holding.private_blocks
        parent = holding.nodes[-1] if holding.nodes else None
        budget = holding.private_blocks
        if answer and parent is not None and answer[0][0] == parent.seg:
            grow = min(answer[0][1] - parent.cached, budget)
            if grow > 0:
                self.used_blocks += grow
                self._stored(parent, parent.cached, parent.cached + grow)
                parent.cached += grow
                budget -= grow
            answer = answer[1:]
        for seg, blocks in answer:
            if blocks > budget:
                break
            budget -= blocks
            table = parent.kids if parent is not None else self._root
            node = table.get(seg) if table is not None else None
            if node is None:
                node = _Node(seg, parent)
            if node.cached < blocks:
                if node.cached == 0:
                    self._attach(node)
                self.used_blocks += blocks - node.cached
                self._stored(node, node.cached, blocks)
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
        evictable = self._evictable
        skipped: list[_Node] = []  # the admitting request's own prefix, pinned: kept in place
        fits = True
        while self.used_blocks + need > self.capacity_blocks:
            node = evictable.oldest()
            if node is None:
                fits = False
                break
            if node.pins:
                evictable.discard(node)
                skipped.append(node)
                continue
            give = min(node.cached, self.used_blocks + need - self.capacity_blocks)
            if self.observer is not None:
                self.observer((), [block_id(node.uid, i)
                                   for i in range(node.cached - give, node.cached)])
            node.cached -= give  # the segment's tail blocks go first
            self.used_blocks -= give
            self.evicted_blocks += give
            if node.cached == 0:
                evictable.discard(node)
                self._detach(node)
        for node in reversed(skipped):
            evictable.push_front(node)
        return fits

    def _attach(self, node: _Node) -> None:
        self._n_nodes += 1
        parent = node.parent
        if parent is None:
            self._root[node.seg] = node
            return
        kids = parent.kids
        if kids is None:
            kids = parent.kids = {}
        kids[node.seg] = node
        self._evictable.discard(parent)  # no longer a leaf

    def _detach(self, node: _Node) -> None:
        self._n_nodes -= 1
        parent = node.parent
        if parent is None:
            del self._root[node.seg]
            return
        kids = parent.kids
        assert kids is not None
        del kids[node.seg]
        if not parent.pins and not kids and parent.cached:
            # A leaf again, and as old as the child just evicted: next in line.
            self._evictable.push_front(parent)

    def _unpin(self, node: _Node, now: float) -> None:
        node.pins -= 1
        node.last_used = now
        if not node.pins and not node.kids and node.cached:
            # A pinned segment is never in the eviction order, so it joins at the end (no
            # move needed: `_candidate` is for segments that may already be in it).
            self._evictable.append(node)

    def _candidate(self, node: _Node) -> None:
        if not node.pins and not node.kids and node.cached:
            self._evictable.touch(node)


def blocks_of(tokens: int, block_tokens: int) -> int:
    """Full blocks in `tokens` tokens."""
    return tokens // block_tokens


def ceil_blocks(tokens: int, block_tokens: int) -> int:
    return math.ceil(tokens / block_tokens)
