"""One URL names the Redis topology (router_client.redis_topology)."""

from __future__ import annotations

import pytest

from router_client.redis_topology import CLUSTER, SENTINEL, SINGLE, parse_redis_url


def test_a_plain_url_is_handed_to_redis_py_as_is():
    t = parse_redis_url("rediss://user:pw@redis.internal:6380/2")
    assert (t.kind, t.url, t.tls) == (SINGLE, "rediss://user:pw@redis.internal:6380/2", True)
    assert not t.sharded_pubsub


def test_cluster_seed_nodes_and_credentials():
    t = parse_redis_url("redis+cluster://cacheroute-router-epp-%2A:s%40cret@10.0.0.1:7000,"
                        "10.0.0.2:7001,[fd00::3]:7002")
    assert t.kind == CLUSTER and t.sharded_pubsub
    assert t.hosts == (("10.0.0.1", 7000), ("10.0.0.2", 7001), ("fd00::3", 7002))
    assert (t.username, t.password) == ("cacheroute-router-epp-*", "s@cret")
    assert parse_redis_url("rediss+cluster://h:1/").tls


def test_sentinels_name_the_primary_and_a_database():
    t = parse_redis_url("redis+sentinel://s1:26379,s2:26379,s3:26379/cacheroute/3")
    assert (t.kind, t.service, t.db) == (SENTINEL, "cacheroute", 3)
    assert len(t.hosts) == 3 and not t.sharded_pubsub


@pytest.mark.parametrize("url, why", [
    ("localhost:6379", "not a redis URL"),
    ("redis+raft://h:1", "unknown scheme"),
    ("redis+cluster://", "names no host"),
    ("redis+cluster://h", "not host:port"),
    ("redis+cluster://h:x", "no port number"),
    ("redis+cluster://h:70000", "out of range"),
    ("redis+cluster://h:1/4", "only database 0"),
    ("redis+sentinel://h:26379", "names the primary"),
    ("redis+sentinel://h:26379/m/x", "not a number"),
])
def test_bad_urls_say_what_is_wrong(url, why):
    with pytest.raises(ValueError, match=why):
        parse_redis_url(url)
