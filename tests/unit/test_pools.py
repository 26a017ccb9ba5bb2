"""Pools: the pools file's rules, model -> pool, and a window cut by pool (all pure)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_svc.orchestration.window_view import split_by_pool, traffic_from_window
from router_client.keys import derive_key
from router_client.pools import (
    DEFAULT_POOL,
    PoolRoutes,
    PoolsError,
    PoolSpec,
    parse_pools,
)
from streams.assembly import KEY_COLUMNS
from tests.service.windows import make_window

GOOD = """
[pools.chat]
models = ["llama-3-8b", "meta-llama/Llama-3.1-70B"]
destinations = ["c0=http://10.0.0.1:8000", "c1=http://10.0.0.2:8000*2"]
q_cap = 40
warm_slots_per_destination = 256
learn_q_cap = true

[pools.sql]
models = ["llama-3-8b@sql-lora"]
destinations = ["s0"]

[pools.default]
models = ["*"]
destinations = ["d0", "d1"]
"""


def test_a_pools_file_parses_with_each_pools_settings_and_namespace():
    specs = {s.name: s for s in parse_pools(GOOD)}
    assert list(specs) == ["chat", "sql", "default"]
    chat = specs["chat"]
    assert chat.settings == {"q_cap": 40.0, "warm_slots_per_destination": 256,
                             "learn_q_cap": True}
    assert chat.namespace_of("cacheroute") == "cacheroute:chat"
    assert specs["default"].namespace_of("cacheroute") == "cacheroute"  # keys stay put
    assert chat.topic_of("cacheroute.planner-state") == "cacheroute.planner-state.chat"


@pytest.mark.parametrize("text, says", [
    ("[pools.Chat]\ndestinations = ['a']", "pool name 'Chat'"),
    ("[pools.a]\ndestinations = ['x']\n[pools.b]\ndestinations = ['x']", "destination 'x'"),
    ("[pools.a]\nmodels = ['m']\ndestinations = ['x']\n"
     "[pools.b]\nmodels = ['m']\ndestinations = ['y']", "model 'm' is claimed"),
    ("[pools.a]\ndestinations = ['x']\n[pools.b]\ndestinations = ['y']", "both claim '*'"),
    ("[pools.a]\ndestinations = ['x']\nq_cap = 'lots'", "q_cap must be a number"),
    ("[pools.a]\ndestinations = ['x']\nwarm_slots_per_destination = 1.5", "whole number"),
    ("[pools.a]\ndestinations = ['x']\nredis_url = 'redis://evil'", "unknown setting"),
    ("[pools.a]\ndestinations = ['x']\nq_cap = nan", "q_cap must be in"),
    ("[pools.a]\ndestinations = ['x']\ninterval_s = 0", "interval_s must be in"),
    ("[pools.a]\ndestinations = ['x']\nrate_noise_z = 50", "rate_noise_z must be in"),
    ("[pools.a]\ndestinations = ['x']\nnamespace = '{x}'", "without '{' or '}'"),
    ("[pools.a]\ndestinations = ['x']\nnamespace = 'cacheroute'\n"
     "[pools.default]\nmodels = ['m']\ndestinations = ['y']", "would share the Redis namespace"),
    ("[pools.a]\nmodels = ['m']\ndestinations = ['x']\nnamespace = 'cacheroute:b'\n"
     "[pools.b]\ndestinations = ['y']", "would share the Redis namespace"),
    ("[pools.a]\ndestinations = []", "at least one destination"),
    ("[pools.a]\nmodels = []\ndestinations = ['x']", "models must be a list"),
    ("[pools]", "defines no pool"),
    ("[pool.a]\ndestinations = ['x']", "unknown table"),
    ("pools = [", "not TOML"),
])
def test_a_bad_pools_file_is_refused_with_the_reason(text, says):
    with pytest.raises(PoolsError, match=re.escape(says)):
        parse_pools(text)


def test_the_most_specific_claim_wins_and_the_rest_go_to_the_catch_all():
    routes = PoolRoutes(parse_pools(GOOD))
    assert routes.pool_of_key("llama-3-8b/p:abc") == "chat"
    assert routes.pool_of_key("llama-3-8b@sql-lora/p:abc") == "sql"
    assert routes.pool_of_key("llama-3-8b@other-lora#salt/h:t") == "chat"  # adapter unclaimed
    assert routes.pool_of_key("llama-3-8b@sql-lora#salt/h:t") == "sql"
    assert routes.pool_of_key("mistral/p:abc") == "default"
    without_catch_all = PoolRoutes([s for s in parse_pools(GOOD) if s.name != "default"])
    assert without_catch_all.pool_of_key("mistral/p:abc") is None


def test_a_model_name_that_keys_hash_still_finds_its_pool():
    routes = PoolRoutes(parse_pools(GOOD))
    key = derive_key({"model": "meta-llama/Llama-3.1-70B", "messages": [
        {"role": "user", "content": "hi"}]}, {}).key
    assert key.startswith("~")  # the '/' in the name made the key carry its hash
    assert routes.pool_of_key(key) == "chat"


@settings(max_examples=200, deadline=None)
@given(model=st.sampled_from(["llama-3-8b", "meta-llama/Llama-3.1-70B", "qwen", "a@b", "x" * 200]),
       lora=st.sampled_from([None, "sql-lora", "other", "with/slash"]),
       salt=st.sampled_from([None, "s1", "t#2"]),
       header=st.booleans())
def test_the_gateway_and_the_planner_agree_on_every_requests_pool(model, lora, salt, header):
    """The pool comes from the key alone: what the gateway derives from a body is what the
    planner reads back from the key in a window."""
    specs = parse_pools(GOOD)
    body: dict[str, object] = {"model": model, "prompt": "some prompt"}
    if lora:
        body["lora_name"] = lora
    if salt:
        body["cache_salt"] = salt
    key = derive_key(body, {"x-routing-key": "tenant-1"} if header else {}).key
    expected = ("sql" if (model, lora) == ("llama-3-8b", "sql-lora")
                else "chat" if model in ("llama-3-8b", "meta-llama/Llama-3.1-70B")
                else "default")
    assert PoolRoutes(specs).pool_of_key(key) == expected


def _window(keys: list[str], rates: list[float], destinations: list[str]):
    return make_window(keys, np.asarray(rates), window_end_ms=100_000,
                       destinations=destinations)


def test_a_window_is_cut_by_pool_with_its_rows_and_destinations():
    routes = PoolRoutes([PoolSpec("chat", ("llama",), ("c0",)),
                         PoolSpec("code", ("qwen",), ("q0", "q1"))])
    keys = ["llama/h:a", "qwen/h:b", "mistral/h:c", "llama/h:d", "qwen@x/h:e"]
    window = _window(keys, [1.0, 2.0, 3.0, 4.0, 5.0], ["c0", "q0", "q1", "zz"])
    window = dataclasses.replace(window, overflow_keys=100, overflow_rate_per_s=12.0,
                                 active_keys=105)
    parts, unclaimed = split_by_pool(window, ["chat", "code"], routes.pool_of_scope,
                                     {"c0": "chat", "q0": "code", "q1": "code"})
    assert unclaimed == 1
    chat, code = parts["chat"], parts["code"]
    assert chat.keys == ["llama/h:a", "llama/h:d"]
    assert list(chat.rate_per_s) == [1.0, 4.0]
    assert code.keys == ["qwen/h:b", "qwen@x/h:e"]
    assert list(code.rate_per_s) == [2.0, 5.0]
    assert set(chat.destinations) == {"c0"} and set(code.destinations) == {"q0", "q1"}
    # The nameless overflow is shared by rate: chat has 5 of the 15 named req/s, code 7
    # (the unclaimed model's share goes nowhere, as its keys do).
    assert chat.overflow_rate_per_s == pytest.approx(12.0 * 5 / 15)
    assert code.overflow_rate_per_s == pytest.approx(12.0 * 7 / 15)
    assert chat.active_keys == 2 + chat.overflow_keys


@settings(max_examples=100, deadline=None)
@given(scopes=st.lists(st.sampled_from(["a", "b", "c", "b@l", "d#s"]), min_size=0, max_size=60))
def test_every_key_lands_in_exactly_one_part_with_its_own_columns(scopes):
    routes = PoolRoutes([PoolSpec("p", ("a", "b"), ("x",)), PoolSpec("q", ("c",), ("y",))])
    keys = [f"{s}/h:{i}" for i, s in enumerate(scopes)]
    rates = np.arange(len(keys), dtype=np.float64) + 0.5
    window = _window(keys, list(rates), [])
    parts, unclaimed = split_by_pool(window, ["p", "q"], routes.pool_of_scope, {})
    seen = [k for part in parts.values() for k in part.keys]
    assert sorted(seen) == sorted(k for k in keys if not k.startswith("d#"))
    assert unclaimed == sum(k.startswith("d#") for k in keys)
    row = {k: i for i, k in enumerate(keys)}
    for part in parts.values():
        for name, _ in KEY_COLUMNS:
            column = getattr(part, name)
            assert len(column) == len(part.keys)
            assert list(column) == [getattr(window, name)[row[k]] for k in part.keys]


def test_a_single_pool_claims_every_model():
    routes = PoolRoutes.single()
    assert routes.pool_of_key("anything@l#s/p:x") == DEFAULT_POOL
    assert routes.pool_of_key("no-slash-key") == DEFAULT_POOL


def test_a_pools_window_keeps_each_keys_last_destination() -> None:
    """The stream's last-destination column is cut with the rows (warm placement per pool)."""
    routes = PoolRoutes([PoolSpec("chat", ("llama",), ("c0",)),
                         PoolSpec("code", ("qwen",), ("q0", "q1"))])
    keys = ["llama/h:a", "qwen/h:b", "llama/h:d", "qwen/h:e"]
    window = make_window(keys, np.ones(4), window_end_ms=100_000,
                         destinations=["c0", "q0", "q1"],
                         last_destinations={"llama/h:a": "c0", "qwen/h:b": "q1",
                                            "qwen/h:e": "q0"})
    parts, _ = split_by_pool(window, ["chat", "code"], routes.pool_of_scope,
                             {"c0": "chat", "q0": "code", "q1": "code"})
    for pool, ids, expected in (("chat", ["c0"], ["c0", None]),
                                ("code", ["q0", "q1"], ["q1", "q0"])):
        warm = traffic_from_window(parts[pool]).warm_at(ids)
        assert warm is not None
        assert [ids[i] if i >= 0 else None for i in warm.tolist()] == expected
