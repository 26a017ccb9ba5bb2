"""A KV-event publisher speaking vLLM's protocol, for the emulated engines and the tests.

What vLLM's `ZmqEventPublisher` does on the wire (vllm/distributed/kv_events.py): a PUB
socket sends `[topic, seq (8 bytes, big-endian), payload]`, `seq` counting from 0, and a
ROUTER socket answers a replay request (the first wanted sequence, 8 bytes) with
`[seq, payload]` for each buffered batch from there and then `[-1, b""]`. The payload is
the msgpack of a KVEventBatch; `layout` picks which of vLLM's encodings: "tagged_map"
(events as maps tagged by "type", the batch an array: vLLM 0.28) or "array" (everything
an array: vLLM 0.9-0.10).

`drop_next(n)` makes the next n batches go to the replay buffer but not to the PUB socket,
as a slow subscriber's high-water mark drops them: what the bridge must detect and fill.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: Sequence[int | bytes], parent: int | bytes | None, block_size: int,
           token_ids: list[int] | None = None, medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": token_ids or [], "block_size": block_size, "lora_id": None,
            "medium": medium, "lora_name": None}


def removed(hashes: Sequence[int | bytes], medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


_ORDER = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                          "lora_id", "medium", "lora_name"),
          "BlockRemoved": ("block_hashes", "medium"), "AllBlocksCleared": ()}


def encode(events: list[dict[str, Any]], ts: float, layout: str = "tagged_map") -> bytes:
    if layout == "tagged_map":
        return msgspec.msgpack.encode([ts, events])
    if layout == "array":
        return msgspec.msgpack.encode(
            [ts, [[e["type"], *(e[k] for k in _ORDER[e["type"]])] for e in events]])
    raise ValueError(f"layout {layout!r}: tagged_map or array")


def _bind(sock: zmq.Socket[bytes], host: str, port: int) -> int:
    if not port:
        return sock.bind_to_random_port(f"tcp://{host}")
    deadline = time.monotonic() + 5
    while True:  # a closed socket releases its port asynchronously
        try:
            sock.bind(f"tcp://{host}:{port}")
            return port
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class KvEventPublisher:
    def __init__(self, host: str = "127.0.0.1", *, buffer_steps: int = 10_000,
                 layout: str = "tagged_map", topic: bytes = b"", port: int = 0,
                 replay_port: int = 0) -> None:
        """`port` / `replay_port` 0: any free port; given: that one (a restarted engine keeps
        its address), waiting up to 5 s for a previous socket to release it."""
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.port = _bind(self.pub, host, port)
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay_port = _bind(self.replay, host, replay_port)
        self.host, self.layout, self.topic = host, layout, topic
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._drop = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://{self.host}:{self.replay_port}"

    def drop_next(self, n: int) -> None:
        self._drop = n

    def publish(self, events: list[dict[str, Any]], ts: float | None = None) -> int:
        payload = encode(events, time.time() if ts is None else ts, self.layout)
        return self.publish_raw(payload)

    def publish_raw(self, payload: bytes) -> int:
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            if self._drop > 0:
                self._drop -= 1
            else:
                self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def send_frames(self, frames: list[bytes]) -> None:
        """Anything at all on the PUB socket (garbage tests)."""
        with self._lock:
            self.pub.send_multipart(frames)

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self.replay.poll(50):
                continue
            with self._lock:
                frames = self.replay.recv_multipart()
                if len(frames) != 3 or len(frames[2]) != 8:
                    continue
                client, start = frames[0], int.from_bytes(frames[2], "big")
                for seq, payload in self._buffer:
                    if seq >= start:
                        self.replay.send_multipart([client, b"", seq.to_bytes(8, "big"),
                                                    payload])
                self.replay.send_multipart([client, b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.pub.close()
        self.replay.close()
