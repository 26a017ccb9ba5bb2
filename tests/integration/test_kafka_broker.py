"""The local Apache Kafka (planner_svc/devstack/kafka.py): it formats its storage, picks its
own port, serves produce and fetch, keeps its data across a stop and start on the same port,
and says how to install what is missing in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer

from planner_svc.devstack.kafka import INSTALL_HINT, JAVA_HINT, restart_kafka, start_kafka
from planner_svc.devstack.processes import ServerStartError
from tests.integration.test_broker_loss import values_of

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for v in values:
        p.produce(topic, value=v)
    assert p.flush(20) == 0


def test_kafka_serves_and_keeps_its_data_across_a_restart(tmp_path: Path) -> None:
    broker = start_kafka(tmp_path)
    try:
        assert broker.port not in (0, broker.controller_port)
        assert (broker.datadir / "meta.properties").exists()  # formatted by StorageTool
        first = [b"a-%d" % i for i in range(100)]
        produce(broker.bootstrap, "kept", first)  # auto-created on first use
        port = broker.port
        broker.process.stop()
        assert not broker.process.alive()
        restart_kafka(broker)
        assert broker.port == port
        produce(broker.bootstrap, "kept", [b"after"])
        assert values_of(broker.bootstrap, "kept", 101) == [*first, b"after"]
        assert broker.process.peak_rss_mb() < 512
    finally:
        broker.process.stop()
    assert broker.process.log_path.parent == tmp_path  # its log is in the workdir


def test_missing_jars_say_how_to_install_them(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEROUTE_KAFKA_LIB", str(tmp_path / "nothing-here"))
    with pytest.raises(ServerStartError, match="jars are not in") as err:
        start_kafka(tmp_path)
    assert INSTALL_HINT in str(err.value) and "\n" not in str(err.value)


def test_missing_java_says_how_to_install_it(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    with pytest.raises(ServerStartError) as err:
        start_kafka(tmp_path)
    assert str(err.value) == JAVA_HINT
