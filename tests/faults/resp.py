"""Find frame boundaries in a Redis protocol (RESP2/RESP3) byte stream (pure).

The fault proxy uses it to drop, duplicate or delay whole pub/sub frames
without corrupting the stream around them.
"""

from __future__ import annotations

_SIMPLE = b"+-:_,#("
_BULK = b"$=!"
_AGGREGATE = b"*>~"
_PAIRS = b"%|"
_MESSAGE_HEADS = (b"*3\r\n$7\r\nmessage\r\n", b">3\r\n$7\r\nmessage\r\n")


def frame_end(buf: bytes | bytearray, pos: int = 0) -> int | None:
    """Index just past the frame starting at `pos`; None if the frame is incomplete."""
    if pos >= len(buf):
        return None
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return None
    kind, after = buf[pos : pos + 1], nl + 2
    if kind in _SIMPLE:
        return after
    n = int(buf[pos + 1 : nl])
    if kind in _BULK:
        end = after + n + 2
        return after if n < 0 else (end if len(buf) >= end else None)
    if kind in _AGGREGATE or kind in _PAIRS:
        count = n * 2 if kind in _PAIRS else n
        for _ in range(max(0, count)):
            nxt = frame_end(buf, after)
            if nxt is None:
                return None
            after = nxt
        return after
    raise ValueError(f"not a RESP frame: {bytes(buf[pos : pos + 20])!r}")


def split_frames(buf: bytearray) -> list[bytes]:
    """Remove and return every complete frame at the start of `buf`."""
    frames, pos = [], 0
    while (end := frame_end(buf, pos)) is not None:
        frames.append(bytes(buf[pos:end]))
        pos = end
    del buf[:pos]
    return frames


def is_pubsub_message(frame: bytes) -> bool:
    """True for a published message delivered to a subscriber."""
    return frame.startswith(_MESSAGE_HEADS)
