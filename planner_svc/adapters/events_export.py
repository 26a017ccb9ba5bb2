"""Read a whole events topic, for replaying recorded traffic (`cacheroute replay --trace
kafka://HOST:PORT/TOPIC`). Every partition from its beginning to its end at the time of the
call; the values are returned as they are (planner_svc.simulator.trace decodes them).

The end is the partitions' high watermarks, then whatever arrives until the topic has been
quiet for `quiet_s`: some brokers (Tansu) report a watermark at the last record batch's
first offset, so the last batch's other records come after it."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition


class ExportError(RuntimeError):
    """The topic cannot be read; the message says why."""


def parse_topic_url(url: str) -> tuple[str, str]:
    """`kafka://host:port[,host:port]/topic` -> (bootstrap, topic)."""
    rest = url.removeprefix("kafka://")
    bootstrap, _, topic = rest.partition("/")
    if not bootstrap or not topic or "/" in topic:
        raise ExportError(f"{url!r}: expected kafka://HOST:PORT/TOPIC")
    return bootstrap, topic


def read_topic(bootstrap: str, topic: str, *, deadline_s: float = 120.0,
               quiet_s: float = 1.0, max_bytes: int = 2 << 30,
               at_least: int = 0) -> list[bytes]:
    """Every value of `topic`, to its end and to at least `at_least` messages in all (for
    writes still landing, such as dead letters), or `ExportError` at the deadline. Reading
    to a known end, not until the topic goes quiet, keeps this right on a loaded machine,
    where the first fetch can take longer than any idle cut-off."""
    consumer = Consumer({"bootstrap.servers": bootstrap,
                         "group.id": f"cacheroute-export-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    give_up = time.monotonic() + deadline_s
    try:
        try:
            meta = consumer.list_topics(topic, timeout=min(10.0, deadline_s))
        except KafkaException as exc:
            raise ExportError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise ExportError(f"topic {topic!r} does not exist at {bootstrap}")
        partitions = sorted(found.partitions)
        try:
            ends = {p: consumer.get_watermark_offsets(
                        TopicPartition(topic, p),
                        timeout=max(1.0, give_up - time.monotonic()))[1]
                    for p in partitions}
        except KafkaException as exc:
            raise ExportError(f"{topic}: cannot read its end offsets: {exc}") from None
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        read = dict.fromkeys(partitions, 0)
        values: list[bytes] = []
        size = 0
        last = time.monotonic()
        while (any(read[p] < ends[p] for p in partitions) or len(values) < at_least
               or time.monotonic() - last < quiet_s):
            if time.monotonic() > give_up:
                raise ExportError(f"{topic}: not read to its end within {deadline_s:.0f} s "
                                  f"({len(values)} messages so far, offsets {read}, "
                                  f"watermarks {ends}, wanted >= {at_least})")
            m = consumer.poll(0.2)
            if m is None or m.error():
                continue
            value = m.value() or b""
            size += len(value)
            if size > max_bytes:
                raise ExportError(f"{topic}: more than {max_bytes >> 20} MiB; export a "
                                  "shorter stretch")
            read[m.partition() or 0] = (m.offset() or 0) + 1
            values.append(value)
            last = time.monotonic()
        return values
    finally:
        consumer.close()
