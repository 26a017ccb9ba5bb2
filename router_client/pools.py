"""Pools: which model pool a request or a routing key belongs to, and the pools file (pure).

A platform team serves many models behind one gateway; each model (or LoRA set) runs on
its own engines. A *pool* is one such group: its own destinations, q_cap, W, control loop,
plan versions and Redis namespace, all planned by one planner process. The gateway maps each
request's model to its pool and routes it with that pool's plan; the planner splits each
stream window by pool the same way.

No event needs a pool field for that: every routing key starts with the scope the engine
never shares a cache across (`<model>[@<lora>][#<salt>]/...`, router_client.keys), so the
key itself says which pool it belongs to, by the one rule below (`PoolRoutes.pool_of_key`),
in the gateway and in the planner alike.

The pools file (TOML), read by the planner and the gateway:

    [pools.chat]
    models = ["llama-3-8b", "llama-3-8b@support-lora"]
    destinations = ["c0=http://10.0.0.1:8000", "c1=http://10.0.0.2:8000*2"]
    q_cap = 40                       # any per-pool planning setting (POOL_SETTINGS)
    warm_slots_per_destination = 256

    [pools.default]
    models = ["*"]                   # every model no other pool claims
    destinations = ["d0=http://10.0.1.1:8000"]

Rules, each checked with a clear error: pool names are DNS labels (they become part of a
Redis namespace and a topic name); a model is claimed by at most one pool; at most one pool
claims `*`; a destination id belongs to one pool only (engine signals and per-destination
statistics are attributed by id). A key whose model no pool claims (and no `*` pool) is
not planned; the gateway answers such a request with 404.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from router_client.keys import bounded_part
from router_client.plan import parse_destinations

DEFAULT_POOL = "default"
ANY_MODEL = "*"
MAX_POOLS = 1024
MAX_MODELS_PER_POOL = 1024
MAX_POOLS_FILE_BYTES = 4 << 20
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")

# The planning settings a pool may set for itself (everything else, the broker, Redis, gRPC,
# signing key and leader lease, is the process's): type and plausible range (the gRPC API's;
# outside it a value is a typo or an attack, never a configuration).
POOL_SETTINGS: dict[str, tuple[type, float, float]] = {
    "q_cap": (float, 1e-3, 1e7),
    "warm_slots_per_destination": (int, 1, 1_000_000),
    "imbalance_tolerance": (float, 0.0, 10.0),
    "interval_s": (float, 0.1, 86_400.0),
    "hysteresis": (float, 0.0, 100.0),
    "min_dwell_s": (float, 0.0, 86_400.0),
    "byte_aware": (bool, 0, 1),
    "admission_hysteresis": (float, 0.0, 100.0),
    "replica_hysteresis": (float, 0.0, 0.99),
    "balance_effort": (float, 0.0, 1.0),
    "rate_noise_z": (float, 0.0, 10.0),
    "learn_warm_slots": (bool, 0, 1),
    "learn_q_cap": (bool, 0, 1),
    "hashed_tail": (bool, 0, 1),
    "warm_placement": (bool, 0, 1),
}


class PoolsError(ValueError):
    """A pools file or pool argument that cannot be used (the message says why)."""


def check_pool_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PoolsError(f"pool name {name!r}: use 1-63 lower-case letters, digits and '-' "
                         "(it becomes part of a Redis namespace and a topic name)")
    return name


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One pool as configured. `destinations` use the planner's `--destinations` syntax."""

    name: str
    models: tuple[str, ...] = (ANY_MODEL,)
    destinations: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    namespace: str = ""  # "" = derived from the process's namespace (`namespace_of`)

    def namespace_of(self, base: str) -> str:
        """The pool's Redis namespace: the process's own for the default pool (a
        single-pool deployment moves to a pools file without moving its keys)."""
        if self.namespace:
            return self.namespace
        return base if self.name == DEFAULT_POOL else f"{base}:{self.name}"

    def topic_of(self, base: str) -> str:
        """The pool's durable-history topic, by the same rule."""
        return base if self.name == DEFAULT_POOL or not base else f"{base}.{self.name}"


class PoolRoutes:
    """model scope -> pool. The most specific claim wins: `llama@sql` over `llama`, any
    claimed model over `*`."""

    def __init__(self, specs: Iterable[PoolSpec]) -> None:
        self._by_scope: dict[str, str] = {}
        self.catch_all: str | None = None
        self.pools: tuple[str, ...] = ()
        names = []
        for spec in specs:
            names.append(spec.name)
            for model in spec.models:
                if model == ANY_MODEL:
                    if self.catch_all is not None:
                        raise PoolsError(f"pools {self.catch_all!r} and {spec.name!r} both "
                                         "claim '*' (every other model): keep one")
                    self.catch_all = spec.name
                    continue
                scope = bounded_scope(model)
                held = self._by_scope.get(scope)
                if held is not None:
                    raise PoolsError(f"model {model!r} is claimed by pools {held!r} and "
                                     f"{spec.name!r}: a model belongs to one pool")
                self._by_scope[scope] = spec.name
        self.pools = tuple(names)

    def pool_of_scope(self, scope: str) -> str | None:
        """The pool of a key scope `<model>[@<lora>][#<salt>]`, or None (unclaimed)."""
        found = self._by_scope.get(scope)
        if found is not None:
            return found
        # Less specific: drop the salt, then the adapter (cut at each '@' / '#' from the end).
        for i in range(len(scope) - 1, 0, -1):
            if scope[i] in "@#":
                found = self._by_scope.get(scope[:i])
                if found is not None:
                    return found
        return self.catch_all

    def pool_of_key(self, key: str) -> str | None:
        return self.pool_of_scope(key.partition("/")[0])

    @classmethod
    def single(cls) -> PoolRoutes:
        """A single-pool deployment: every model in the default pool."""
        return cls([PoolSpec(DEFAULT_POOL)])


def bounded_scope(model: str) -> str:
    """A configured `model[@lora]` as it appears in a routing key (long names and names
    with '/' are hashed there, router_client.keys)."""
    name, at, lora = model.partition("@")
    return bounded_part(name) + (at + bounded_part(lora) if at else "")


def parse_pools(text: str | bytes, *, source: str = "the pools file",
                base_namespace: str = "cacheroute") -> list[PoolSpec]:
    """The pools of a pools file (module doc), every rule checked (namespaces derived from
    `base_namespace`, the process's)."""
    if len(text) > MAX_POOLS_FILE_BYTES:
        raise PoolsError(f"{source} is larger than {MAX_POOLS_FILE_BYTES} bytes")
    try:
        raw = tomllib.loads(text.decode() if isinstance(text, bytes) else text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PoolsError(f"{source} is not TOML: {exc}") from None
    unknown = set(raw) - {"pools"}
    if unknown:
        raise PoolsError(f"{source}: unknown table(s) {sorted(unknown)}; "
                         "pools go under [pools.<name>]")
    tables = raw.get("pools", {})
    if not isinstance(tables, dict) or not tables:
        raise PoolsError(f"{source} defines no pool: add [pools.<name>] tables")
    if len(tables) > MAX_POOLS:
        raise PoolsError(f"{source} defines {len(tables)} pools; at most {MAX_POOLS}")
    specs = [pool_spec(name, table, source=source) for name, table in tables.items()]
    check_pools(specs)
    check_namespaces(specs, base_namespace)
    return specs


def pool_spec(name: str, table: Any, *, source: str = "the pools file") -> PoolSpec:
    check_pool_name(name)
    where = f"{source}, pool {name!r}"
    if not isinstance(table, dict):
        raise PoolsError(f"{where}: must be a table")
    table = dict(table)
    models = table.pop("models", [ANY_MODEL])
    destinations = table.pop("destinations", [])
    namespace = table.pop("namespace", "")
    if (not isinstance(models, list) or not models or len(models) > MAX_MODELS_PER_POOL
            or not all(isinstance(m, str) and m and "\0" not in m for m in models)):
        raise PoolsError(f"{where}: models must be a list of 1-{MAX_MODELS_PER_POOL} "
                         "model names ('*' = every model no other pool claims)")
    if not isinstance(destinations, list) or not all(isinstance(d, str) for d in destinations):
        raise PoolsError(f"{where}: destinations must be a list of 'id[=url][*weight]'")
    try:
        parsed = parse_destinations(tuple(destinations))
    except ValueError as exc:
        raise PoolsError(f"{where}: destinations: {exc}") from None
    if not parsed:
        raise PoolsError(f"{where}: needs at least one destination")
    if (not isinstance(namespace, str) or len(namespace) > 200
            or any(c in namespace for c in "\0{}")):
        raise PoolsError(f"{where}: namespace must be a string of at most 200 characters "
                         "without '{' or '}' (every plan key shares the {plan} hash tag)")
    settings: dict[str, Any] = {}
    for key, value in table.items():
        rule = POOL_SETTINGS.get(key)
        if rule is None:
            raise PoolsError(f"{where}: unknown setting {key!r}; a pool may set "
                             f"{', '.join(sorted(POOL_SETTINGS))}")
        settings[key] = _typed(where, key, value, *rule)
    return PoolSpec(name, tuple(models), tuple(destinations), settings, namespace)


def _typed(where: str, key: str, value: Any, kind: type, lo: float, hi: float) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise PoolsError(f"{where}: {key} must be true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PoolsError(f"{where}: {key} must be a number")
    if kind is int and not float(value).is_integer():
        raise PoolsError(f"{where}: {key} must be a whole number")
    if not lo <= value <= hi:  # NaN fails this too
        raise PoolsError(f"{where}: {key} must be in [{lo:g}, {hi:g}], got {value}")
    return kind(value)


def check_namespaces(specs: Iterable[PoolSpec], base: str) -> None:
    """No two pools in one Redis namespace (they would overwrite each other's plans)."""
    seen: dict[str, str] = {}
    for spec in specs:
        ns = spec.namespace_of(base)
        held = seen.setdefault(ns, spec.name)
        if held != spec.name:
            raise PoolsError(f"pools {held!r} and {spec.name!r} would share the Redis "
                             f"namespace {ns!r}: give one its own `namespace`")


def check_pools(specs: Iterable[PoolSpec]) -> None:
    """The rules that span pools: unique names, one owner per model and per destination."""
    specs = list(specs)
    seen: set[str] = set()
    owner: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise PoolsError(f"pool {spec.name!r} is defined twice")
        seen.add(spec.name)
        for d in parse_destinations(spec.destinations):
            held = owner.setdefault(d.id, spec.name)
            if held != spec.name:
                raise PoolsError(f"destination {d.id!r} is in pools {held!r} and "
                                 f"{spec.name!r}: a destination belongs to one pool")
    PoolRoutes(specs)  # one owner per model, at most one '*'
