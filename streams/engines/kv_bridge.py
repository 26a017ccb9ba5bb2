"""Subscribing to one engine's KV events over ZMQ, in order, with nothing silently lost.

vLLM's publisher (`ZmqEventPublisher`) sends `[topic, seq, payload]` on a PUB socket with
`seq` counting up from 0, and keeps its last batches for replay on a ROUTER socket: a
client sends the first sequence it wants (8 bytes, big-endian) and gets `[seq, payload]`
for every buffered batch from there, then `[-1, b""]`.

`KvEventSubscriber.poll` returns the batches in sequence order:
- the next sequence is applied as it comes;
- a jump (messages the PUB socket dropped: slow subscriber, reconnect) is filled at once
  from the replay socket; what the publisher no longer holds is a hole, and the
  destination's state is rebuilt (`resyncs`) rather than trusted;
- a restarted engine's publisher counts from 0 again: the sequence goes back, or (if it
  has counted past us while we reconnected) jumps to a number whose replayed payload is
  not the one we saw. Either way the state is rebuilt, from the new publisher's history
  when its replay buffer holds it from the start;
- garbage (wrong frame count, a sequence that is not 8 bytes, a
  payload that is not a KV batch) is counted by reason and skipped, so one bad message
  never stops the stream.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import recv_monitor_message

from streams.engines.kv_state import CacheState
from streams.engines.vllm_kv import KvBatch, KvDecodeError, decode_batch

log = logging.getLogger("cacheroute.kv_bridge")
END_SEQ = -1


@dataclass
class BridgeCounters:
    batches: int = 0
    gaps: int = 0  # jumps detected
    replayed: int = 0  # batches recovered from the replay socket
    resyncs: int = 0  # holes the replay could not fill, and publisher restarts
    garbage: Counter[str] = field(default_factory=Counter)
    last_gap_filled_s: float = 0.0  # time from detecting the last gap to filling it


class KvEventSubscriber:
    def __init__(self, destination: str, endpoint: str, replay_endpoint: str | None = None,
                 *, topic: bytes = b"", context: zmq.Context | None = None,
                 replay_timeout_s: float = 0.5, state: CacheState | None = None) -> None:
        self.destination = destination
        self.ctx = context or zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.RCVHWM, 100_000)
        # Connection events: after the connection to the publisher drops, the next
        # message may come from a restarted engine even if its sequence looks contiguous.
        self._monitor = self.sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._reconnected = False
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.state = state or CacheState()
        self.counters = BridgeCounters()
        self.last_seq: int | None = None
        self._last_payload = 0  # hash of the last sequence's payload (a replay matches it)
        self.last_batch_at = 0.0

    # --- the loop ------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 100, max_messages: int = 10_000) -> list[KvBatch]:
        """Read what has arrived (waiting at most `timeout_ms` for the first message),
        apply it to `state`, and return the batches in order."""
        out: list[KvBatch] = []
        self._watch_connection()
        if not self.sub.poll(timeout_ms):
            return out
        self._watch_connection()
        for _ in range(max_messages):
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            out.extend(self._on_message(frames))
        return out

    def _on_message(self, frames: list[bytes]) -> list[KvBatch]:
        parsed = self._parse(frames)
        if parsed is None:
            return []
        seq, payload = parsed
        last = self.last_seq
        if last is None or (seq == last + 1 and not self._reconnected):
            return self._apply(seq, payload)
        self._reconnected = False  # verified by the replay below
        return [*self._recover(last, seq), *self._apply(seq, payload)]

    def _watch_connection(self) -> None:
        while True:
            try:
                recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            self._reconnected = True  # (the only event asked for: a disconnect)

    def _parse(self, frames: list[bytes]) -> tuple[int, bytes] | None:
        if len(frames) != 3:
            self.counters.garbage["frames"] += 1
            return None
        if len(frames[1]) != 8:
            self.counters.garbage["sequence"] += 1
            return None
        return int.from_bytes(frames[1], "big", signed=True), frames[2]

    def _apply(self, seq: int, payload: bytes) -> list[KvBatch]:
        self.last_seq = seq  # consumed, even if garbage: it is not a gap
        self._last_payload = hash(payload)
        try:
            batch = decode_batch(payload)
        except KvDecodeError as exc:
            self.counters.garbage["payload"] += 1
            log.debug("%s: skipped sequence %d: %s", self.destination, seq, exc)
            return []
        now = time.monotonic()
        self.state.apply(batch, now)
        self.counters.batches += 1
        self.last_batch_at = now
        return [batch]

    def _resync(self) -> None:
        self.state.resync()
        self.counters.resyncs += 1

    # --- gaps and restarts -------------------------------------------------------------

    def _recover(self, last: int, seq: int) -> list[KvBatch]:
        """The sequence jumped from `last` to `seq`. Either the PUB socket dropped
        messages (the same publisher: its replay buffer still holds `last` with the bytes
        we saw) or the engine restarted and its publisher counts from 0 again (whether or
        not it has counted past `last` by now). Ask the replay socket from `last` (or from
        0 when the sequence went back) and tell which from what it holds."""
        started = time.monotonic()
        self.counters.gaps += 1
        back = seq <= last
        got = self._replay(0 if back else last, seq) if self.replay_endpoint else {}
        same = not back and got.get(last) is not None and hash(got[last]) == self._last_payload
        if same:
            first = last + 1
        else:
            # Restarted (or the hole outgrew the buffer): what we knew is void. Rebuild
            # from the new publisher's history if it holds it from its start.
            log.warning("%s: KV events: publisher restarted or history lost between %d "
                        "and %d: resync", self.destination, last, seq)
            self._resync()
            first = 0
        out: list[KvBatch] = []
        for s in range(first, seq):
            payload = got.get(s)
            if payload is None:
                if same:  # a hole in the same publisher's stream
                    log.warning("%s: KV events %d..%d lost (replay had %d of them): resync",
                                self.destination, s, seq - 1, len(got))
                    self._resync()
                break
            out.extend(self._apply(s, payload))
            self.counters.replayed += 1
        self.counters.last_gap_filled_s = time.monotonic() - started
        return out

    def _replay(self, first: int, upto: int) -> dict[int, bytes]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        got: dict[int, bytes] = {}
        try:
            assert self.replay_endpoint is not None
            sock.connect(self.replay_endpoint)
            sock.send_multipart([b"", first.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(int(left * 1000) + 1):
                    break
                frames = sock.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    self.counters.garbage["replay"] += 1
                    continue
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == END_SEQ:
                    break
                if first <= seq < upto:
                    got[seq] = frames[2]
                if len(got) >= upto - first:
                    break  # everything asked for: no need to wait for the end marker
        finally:
            sock.close()
        return got

    def close(self) -> None:
        self.sub.disable_monitor()
        self._monitor.close(linger=0)
        self.sub.close(linger=0)
