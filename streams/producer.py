"""An idempotent Kafka producer that replaces itself when the broker stops acknowledging it.

An idempotent producer is known to the broker by a producer id and per-partition
sequence numbers. A broker that lost that state (its storage was wiped, the topic
deleted and created again, a cluster rebuilt) answers every batch with
UNKNOWN_PRODUCER_ID, and librdkafka keeps retrying without reporting an error until
`message.timeout.ms` (5 minutes) expires; a new producer is accepted at once.
Measured on the local broker: after a restart on the same port an old producer's
three messages were still queued after 20 s of `flush`, a fresh producer's went in
under a second.

So every message is kept until it is acknowledged. When the oldest has waited
`stall_s`, the librdkafka producer is purged and replaced, and the kept messages are
produced again in their original order. A message can therefore be written twice
(one whose acknowledgement was lost): fine for both users, the event stream drops
repeats by (producer_id, sequence) and the planner history is a compacted log where
the last value per key wins and the order of re-sent records is preserved.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger(__name__)
DeliveryCallback = Callable[[KafkaError | None, Any], None]


@dataclass
class _Kept:
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    on_delivery: DeliveryCallback | None
    since: float
    queued: bool = True


class RenewingProducer:
    """The subset of `confluent_kafka.Producer` the emitter and the planner history use."""

    def __init__(self, config: dict[str, Any], stall_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._config = dict(config)
        self.stall_s = stall_s
        self._clock = clock
        self._producer = Producer(self._config)
        self._generation = 0
        self._next_id = 0
        self._kept: dict[int, _Kept] = {}  # insertion order = production order
        self._unqueued = 0
        self.renewals = 0

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int | None = None,
                on_delivery: DeliveryCallback | None = None) -> None:
        """As `Producer.produce` (raises BufferError when librdkafka's queue is full, or
        while messages kept from a replaced producer are not all queued again: order
        within a partition is what the stream's deduplication relies on)."""
        if self._unqueued and not self._requeue():
            raise BufferError("re-sending the messages of a replaced producer first")
        ident = self._next_id
        kept = _Kept(topic, value, key, partition, on_delivery, self._clock())
        self._send(ident, kept)  # raises before anything is kept
        self._next_id += 1
        self._kept[ident] = kept

    def poll(self, timeout: float = 0.0) -> int:
        try:
            served = int(self._producer.poll(timeout))
        except KafkaException as exc:
            # An idempotent producer's fatal error (UNKNOWN_PRODUCER_ID after the broker lost
            # its state, with a request in flight): this producer is done. Replace it now
            # and send what it had not delivered again, as for a stall.
            if not _fatal(exc):
                raise
            self._renew(f"fatal producer error: {exc}")
            served = 0
        self._renew_if_stalled()
        self._requeue()
        return served

    def flush(self, timeout: float = 30.0) -> int:
        """Wait for every kept message to be acknowledged; the number still unacknowledged."""
        deadline = self._clock() + timeout
        while self._kept and self._clock() < deadline:
            self.poll(min(0.1, max(0.0, deadline - self._clock())))
        return len(self._kept)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return self._producer.list_topics(topic, timeout=timeout)

    def __len__(self) -> int:
        return len(self._kept)

    # -- inside ----------------------------------------------------------------------

    def _send(self, ident: int, kept: _Kept) -> None:
        generation = self._generation

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if generation != self._generation:
                return  # purged with a replaced producer: the message was sent again
            done = self._kept.pop(ident, None)
            if done is not None and done.on_delivery is not None:
                done.on_delivery(err, msg)

        kwargs: dict[str, Any] = {"value": kept.value, "key": kept.key, "on_delivery": delivered}
        if kept.partition is not None:
            kwargs["partition"] = kept.partition
        try:
            self._producer.produce(kept.topic, **kwargs)
        except KafkaException as exc:
            if not _fatal(exc):
                raise
            self._renew(f"fatal producer error: {exc}")
            raise BufferError("the producer was replaced after a fatal error; "
                              "try again") from exc

    def _renew_if_stalled(self) -> None:
        if not self._kept:
            return
        oldest = next(iter(self._kept.values()))
        now = self._clock()
        if now - oldest.since < self.stall_s:
            return
        self._renew(f"{len(self._kept)} messages unacknowledged for {now - oldest.since:.0f} s")

    def _renew(self, why: str) -> None:
        now = self._clock()
        self._generation += 1  # callbacks of the old producer are ignored from here
        old = self._producer
        with contextlib.suppress(KafkaException):  # a fatally failed producer may refuse
            old.purge()
            old.poll(0)
        self._producer = Producer(self._config)
        self.renewals += 1
        log.warning("kafka producer: %s; replaced the producer (the broker may have lost its "
                    "state) and sending the %d unacknowledged messages again", why,
                    len(self._kept))
        for kept in self._kept.values():
            kept.queued, kept.since = False, now
        self._unqueued = len(self._kept)
        self._requeue()

    def _requeue(self) -> bool:
        """Queue kept messages of a replaced producer again, in order; True when all are."""
        if not self._unqueued:
            return True
        for ident, kept in self._kept.items():
            if kept.queued:
                continue
            try:
                self._send(ident, kept)
            except BufferError:
                return False  # the rest on the next poll, still in order
            kept.queued = True
            self._unqueued -= 1
        return True


def _fatal(exc: KafkaException) -> bool:
    """Whether librdkafka says the producer can never be used again."""
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError):
        return bool(err.fatal()) or err.code() == KafkaError._FATAL
    return "FATAL" in str(exc).upper()
