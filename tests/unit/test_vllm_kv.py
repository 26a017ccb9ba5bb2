"""vLLM KV-event batches decoded in both wire layouts vLLM has shipped, and a destination's
cache state from them (streams.engines.vllm_kv, kv_state)."""

from __future__ import annotations

import msgspec
import pytest

from planner_svc.devstack.kv_publisher import cleared, encode, removed, stored
from streams.engines.kv_state import CacheState
from streams.engines.vllm_kv import KvDecodeError, block_key, decode_batch


@pytest.mark.parametrize("layout", ["tagged_map", "array"])
def test_both_layouts_decode_to_the_same_batch(layout):
    events = [stored([1, 2, 3], None, 16, [5] * 48), removed([2]),
              stored([b"\x01" * 32], 3, 16)]
    batch = decode_batch(encode(events, 12.5, layout))
    assert batch.ts == 12.5 and batch.rank is None and not batch.cleared
    assert [s.hashes for s in batch.stored] == [
        (block_key(1), block_key(2), block_key(3)), (b"\x01" * 32,)]
    assert batch.stored[1].parent == block_key(3) and batch.stored[0].medium == "GPU"
    assert batch.removed[0].hashes == (block_key(2),)


def test_a_map_batch_with_a_rank_and_a_clear():
    payload = msgspec.msgpack.encode({"ts": 1.0, "data_parallel_rank": 2, "events": [
        stored([1], None, 16), cleared(), stored([9], None, 16)]})
    batch = decode_batch(payload)
    assert batch.rank == 2 and batch.cleared
    assert [s.hashes for s in batch.stored] == [(block_key(9),)]  # what came before is void


@pytest.mark.parametrize("payload, why", [
    (b"\xc1", "not msgpack"),
    (msgspec.msgpack.encode("x"), "array or a map"),
    (msgspec.msgpack.encode([1.0]), "ts, events"),
    (msgspec.msgpack.encode(["t", []]), "timestamp"),
    (msgspec.msgpack.encode([1.0, "e"]), "event list"),
    (msgspec.msgpack.encode([1.0, [{"type": "Nope"}]]), "unknown event type"),
    (msgspec.msgpack.encode([1.0, [{"no": "type"}]]), "tagged"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1.5],
                                    "block_size": 16}]]), "not int or bytes"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": [1],
                                    "block_size": 0}]]), "block_size"),
])
def test_bad_payloads_say_why(payload, why):
    with pytest.raises(KvDecodeError, match=why):
        decode_batch(payload)


def test_residency_is_how_long_blocks_stayed_before_removal():
    state = CacheState(window_s=100.0)
    state.apply(decode_batch(encode([stored([1, 2, 3, 4], None, 16)], 0.0)), now=0.0)
    state.apply(decode_batch(encode([stored([9], None, 16, medium="CPU")], 0.0)), now=1.0)
    state.apply(decode_batch(encode([removed([1, 2])], 0.0)), now=10.0)
    state.apply(decode_batch(encode([removed([3])], 0.0)), now=30.0)
    s = state.signals(now=30.0)
    assert s.blocks_resident == 1 and s.block_size == 16  # the CPU copy is another tier
    assert s.residency_s == 10.0  # median of 10, 10, 30
    assert s.stored_per_s == pytest.approx(4 / 100) and s.removed_per_s == pytest.approx(3 / 100)
    assert state.signals(now=200.0).residency_s is None  # the window moved past them


def test_memory_is_bounded():
    state = CacheState(max_blocks=10)
    state.apply(decode_batch(encode([stored(list(range(25)), None, 16)], 0.0)), now=0.0)
    s = state.signals(now=0.0)
    assert s.blocks_resident == 10 and s.forgotten == 15


def test_the_watchers_kv_endpoints():
    from streams.engines.watch import kv_endpoints

    assert kv_endpoints("tcp://10.0.0.5:5557") == ("tcp://10.0.0.5:5557", None)
    assert kv_endpoints("tcp://10.0.0.5:5557/10.0.0.5:5558") == (
        "tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558")
    assert kv_endpoints("tcp://h:1/tcp://h:2") == ("tcp://h:1", "tcp://h:2")
    with pytest.raises(SystemExit, match="expected tcp"):
        kv_endpoints("10.0.0.5:5557")


# SGLang's KV events, as its own classes define them in sgl-project/sglang
# python/sglang/srt/disaggregation/kv_events.py at commit 006d053f182f9b488d2bd841afa06d5f9120a258
# (sglang itself cannot be installed here): vLLM 0.9's array layout without `medium`, sent
# over the same ZMQ frames and replay protocol.
class _SglBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list


class _SglEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_SglEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class BlockRemoved(_SglEvent):
    block_hashes: list[int]


class AllBlocksCleared(_SglEvent):
    pass


def test_sglang_batches_decode():
    payload = msgspec.msgpack.encode(_SglBatch(ts=3.5, events=[
        BlockStored([11, 12], None, list(range(32)), 16, None),
        BlockStored([13], 12, list(range(16)), 16, 7),
        BlockRemoved([11]),
    ]))
    batch = decode_batch(payload)
    assert batch.ts == 3.5 and not batch.cleared
    assert [s.hashes for s in batch.stored] == [(block_key(11), block_key(12)),
                                                (block_key(13),)]
    assert batch.stored[1].parent == block_key(12) and batch.stored[1].lora == "7"
    assert batch.stored[0].medium is None and batch.removed[0].hashes == (block_key(11),)
    cleared_batch = decode_batch(msgspec.msgpack.encode(_SglBatch(ts=4.0, events=[
        BlockStored([1], None, [], 16, None), AllBlocksCleared()])))
    assert cleared_batch.cleared and not cleared_batch.stored
