"""Routing keys from content (router_client.keys): the rule and its examples."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router_client.keys import KeyRule, derive_key

SYS = {"role": "system", "content": "You are the ACME support assistant. " * 10}


DEFAULT = KeyRule()


def key(body: dict, headers: dict | None = None, rule: KeyRule = DEFAULT) -> str:
    return derive_key(body, headers or {}, rule).key


def chat(*messages: dict, **extra: object) -> dict:
    return {"model": "llama", "messages": list(messages), **extra}


def u(text: str) -> dict:
    return {"role": "user", "content": text}


def a(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_every_turn_and_conversation_of_an_application_keys_on_its_system_prompt():
    first = key(chat(SYS, u("my printer is broken")))
    assert first == key(chat(SYS, u("my printer is broken"), a("try this"), u("no luck")))
    assert first == key(chat(SYS, u("a different question")))
    assert first != key(chat({"role": "system", "content": "Another app."}, u("my printer")))


def test_without_a_system_prompt_the_first_user_turn_is_the_conversation():
    k = key(chat(u("hello, I am Ann")))
    assert k == key(chat(u("hello, I am Ann"), a("hi Ann"), u("what is 2+2?")))
    assert k != key(chat(u("hello, I am Bob")))


def test_model_lora_and_salt_separate_keys_and_a_header_wins():
    base = chat(SYS, u("q"))
    assert key(base).startswith("llama/p:")
    assert key({**base, "lora_name": "sql"}).startswith("llama@sql/")
    assert key({**base, "cache_salt": "tenant-9"}).startswith("llama#tenant-9/")
    assert key({**base, "model": "other"}) != key(base)
    assert key(base, {"x-routing-key": "acme"}) == "llama/h:acme"
    assert key(base, {"x-tenant": "acme"}, KeyRule(header="x-tenant")) == "llama/h:acme"


def test_completions_and_token_id_prompts():
    assert key({"model": "m", "prompt": "Translate: hello"}) == \
        key({"model": "m", "prompt": "Translate: hello"})
    assert key({"model": "m", "prompt": [1, 2, 3]}) != key({"model": "m", "prompt": [1, 2, 4]})
    batch = {"model": "m", "prompt": ["batched", "x"]}
    assert key(batch) == key({"model": "m", "prompt": "batched"})


def test_only_the_leading_prefix_counts():
    rule = KeyRule(prefix_chars=64)
    long = "x" * 100
    assert key({"model": "m", "prompt": long + "A"}, rule=rule) == \
        key({"model": "m", "prompt": long + "B"}, rule=rule)


@given(st.text(max_size=300), st.text(max_size=300))
def test_keys_are_bounded_and_never_contain_separators_from_the_input(model, header):
    k = key({"model": model, "messages": [u("q")]}, {"x-routing-key": header} if header else {})
    assert len(k) < 300 and "\0" not in k
    scope, _, ident = k.partition("/")
    assert "/" not in scope and ident.startswith(("h:", "p:"))
