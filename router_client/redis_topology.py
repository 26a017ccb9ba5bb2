"""Where Redis is, as one URL, for the planner and the routers alike (pure).

    redis://[user:pass@]host:port[/db]                       one server (or a proxy)
    rediss://...                                             the same over TLS
    redis+cluster://[user:pass@]host:port[,host:port...]     Redis Cluster, by seed nodes
    rediss+cluster://...                                     the same over TLS
    redis+sentinel://[user:pass@]host:port[,host:port...]/<master name>[/db]
                                                             a Sentinel-managed primary

Credentials in a cluster or sentinel URL are the data nodes' (ACL user and password);
Sentinels themselves are reached without them unless `sentinel_password` is given as a
client option. Cluster URLs have no database: Redis Cluster has only database 0.

Every CacheRoute key carries the hash tag `{plan}`, so the install script, the pointer,
the versions index, deltas and router status keys of one namespace live in one slot:
every multi-key command and script stays on one node, and notifications use sharded
pub/sub (SPUBLISH / SSUBSCRIBE), which a cluster delivers on that slot's node only.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

SINGLE, CLUSTER, SENTINEL = "single", "cluster", "sentinel"


@dataclass(frozen=True, slots=True)
class RedisTopology:
    kind: str  # single | cluster | sentinel
    url: str  # as given (single: handed to redis-py as is)
    hosts: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    tls: bool = False
    service: str = ""  # sentinel: the monitored primary's name
    db: int = 0

    @property
    def sharded_pubsub(self) -> bool:
        return self.kind == CLUSTER


def parse_redis_url(url: str) -> RedisTopology:
    """The topology a URL names; ValueError with what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"{url!r}: not a redis URL (redis://, redis+cluster://, "
                         "redis+sentinel://)")
    scheme = scheme.lower()
    if scheme in ("redis", "rediss", "unix"):
        return RedisTopology(SINGLE, url, tls=scheme == "rediss")
    base, plus, kind = scheme.partition("+")
    if not plus or base not in ("redis", "rediss") or kind not in (CLUSTER, SENTINEL):
        raise ValueError(f"{url!r}: unknown scheme {scheme!r}")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    if not at:
        hostlist, userinfo = netloc, ""
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    hosts = tuple(_host_port(h, url) for h in hostlist.split(",") if h.strip())
    if not hosts:
        raise ValueError(f"{url!r}: names no host")
    parts = [p for p in path.split("/") if p]
    service, db = "", 0
    if kind == SENTINEL:
        if not parts:
            raise ValueError(f"{url!r}: a sentinel URL names the primary: "
                             "redis+sentinel://host:26379/<master name>[/db]")
        service = unquote(parts[0])
        db = _db(parts[1], url) if len(parts) > 1 else 0
    elif parts and parts != ["0"]:
        raise ValueError(f"{url!r}: Redis Cluster has only database 0")
    return RedisTopology(kind, url, hosts, username, password, base == "rediss", service, db)


def _host_port(text: str, url: str) -> tuple[str, int]:
    host, colon, port = text.strip().rpartition(":")
    if not colon or not host:
        raise ValueError(f"{url!r}: {text!r} is not host:port")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{url!r}: {text!r} has no port number") from None
    if not 0 < number < 65536:
        raise ValueError(f"{url!r}: port {number} out of range")
    return host.strip("[]"), number


def _db(text: str, url: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{url!r}: database {text!r} is not a number") from None
