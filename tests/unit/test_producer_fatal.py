"""Which librdkafka errors mean an idempotent producer must be replaced (streams.producer)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from streams.producer import _fatal


def test_fatal_errors_are_told_apart():
    assert _fatal(KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error")))
    assert _fatal(KafkaException(KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, "gone",
                                            fatal=True)))
    assert not _fatal(KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "slow")))
