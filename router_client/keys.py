"""Routing keys from what actually decides cache sharing (pure).

An engine reuses a prompt's cached KV only for a request with the same leading
tokens, on the same model weights, with the same LoRA adapter and the same
`cache_salt` (vLLM refuses to share blocks across salts). So the key is

    <model>[@<lora>][#<salt>]/<what the requests share>

and <what the requests share> is, in this order:

1. the value of a configured header (default `x-routing-key`): the caller knows best
   (tenant, application, conversation id). Long values are hashed;
2. otherwise a hash of the request's *leading prefix*: for chat, the leading system (and
   developer) messages plus the first `prefix_user_turns` user turns (default 0) — or,
   when there is no system message, the first user turn — cut to `prefix_chars`
   characters; for completions, the first `prefix_chars` characters of the prompt (or the
   first `prefix_chars // 4` token ids).

Why these choices, with examples (docs/gateway.md has more):
- an application is its system prompt: every conversation of it, and every turn of each,
  keys on that prompt, so they meet its cached KV and the planner sees one key with the
  application's whole rate (and replicates it over as many destinations as that needs);
  per-conversation keys would split the rate into thousands of keys too cold to admit;
- a chat without a system prompt `[user1, assistant1, user2]` keys on `user1`, the same
  as its first turn: every turn of one conversation lands where its history is cached;
- a RAG request `[user: <document> + question]` keys on the document's first
  characters: requests about the same document meet its cached KV;
- the same prompt on two LoRA adapters gets two keys: the adapters' KV differ.

Nothing here reads more than `prefix_chars` characters of content, so the cost is
bounded whatever the request's size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_KEY_PART_CHARS = 128  # a longer header value or model name is hashed


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRule:
    """How a gateway derives routing keys (see the module doc)."""

    header: str = "x-routing-key"
    prefix_chars: int = 8192
    prefix_user_turns: int = 0
    affinity_header: str = "x-session-id"

    def __post_init__(self) -> None:
        if self.prefix_chars < 1 or self.prefix_user_turns < 0:
            raise ValueError("prefix_chars must be >= 1 and prefix_user_turns >= 0")


@dataclass(frozen=True, slots=True)
class DerivedKey:
    key: str
    source: str  # "header" or "prefix"
    prefix_chars: int  # characters of content the key covers (0 for a header key)
    # Which conversation inside the key: a digest of the key with the first user turn
    # after the system prompt, or with the `affinity_header` (`conversation_id`); None when
    # the key is the conversation.
    affinity: str | None = None


def derive_key(
    body: Mapping[str, Any], headers: Mapping[str, str], rule: KeyRule = KeyRule()
) -> DerivedKey:
    """The routing key of an OpenAI-style chat or completions request body."""
    scope = _scope(body)
    session = headers.get(rule.affinity_header) if rule.affinity_header else None
    given = headers.get(rule.header)
    if given:
        key = f"{scope}/h:{bounded_part(given)}"
        return DerivedKey(key, "header", 0, conversation_id(key, session) if session else None)
    text = _leading_text(body, rule)
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    key = f"{scope}/p:{digest}"
    conversation = session or _conversation(body, rule)
    return DerivedKey(key, "prefix", len(text),
                      conversation_id(key, conversation) if conversation else None)


def conversation_id(key: str, conversation: str) -> str:
    """A conversation's affinity: 16 hex digits over its key and what names it. Scoped by
    the key, so two applications' conversations that open with the same words stay apart;
    a digest, so a router's memory of conversations (and what routers share of it, see
    router_client.shared_history) holds no prompt text and costs the same for every
    conversation."""
    return hashlib.blake2b(f"{key}\0{conversation}".encode("utf-8", "surrogatepass"),
                           digest_size=8).hexdigest()


def _conversation(body: Mapping[str, Any], rule: KeyRule) -> str | None:
    """The first user turn after a system prompt: which conversation of the application."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    seen_system = False
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role in _SYSTEM_ROLES:
            seen_system = True
        elif role == "user":
            if not seen_system:
                return None  # the key is already the conversation
            return _content_text(message.get("content"), min(rule.prefix_chars, 1024))
    return None


def _scope(body: Mapping[str, Any]) -> str:
    """What the engine never shares a cache across: model, LoRA adapter, cache salt."""
    scope = bounded_part(str(body.get("model") or ""))
    lora = body.get("lora_name") or body.get("lora_path") or body.get("lora_adapter")
    if lora:
        scope += "@" + bounded_part(str(lora))
    salt = body.get("cache_salt")
    if salt:
        scope += "#" + bounded_part(str(salt))
    return scope


def bounded_part(value: str) -> str:
    """A key part as keys carry it: the value itself when short and free of '/' and NUL,
    otherwise its hash (router_client.pools matches configured models the same way)."""
    if len(value) <= MAX_KEY_PART_CHARS and "/" not in value and "\0" not in value:
        return value
    return "~" + hashlib.blake2b(value.encode("utf-8", "surrogatepass"),
                                 digest_size=12).hexdigest()


def _leading_text(body: Mapping[str, Any], rule: KeyRule) -> str:
    limit = rule.prefix_chars
    messages = body.get("messages")
    if isinstance(messages, list):
        return _chat_prefix(messages, rule.prefix_user_turns, limit)
    prompt = body.get("prompt")
    if isinstance(prompt, list):  # a batch of prompts, or one prompt as token ids
        if prompt and all(isinstance(t, int) for t in prompt[: limit // 4]):
            return "ids:" + ",".join(map(str, prompt[: max(1, limit // 4)]))
        prompt = prompt[0] if prompt else ""
        if isinstance(prompt, list):
            return "ids:" + ",".join(map(str, prompt[: max(1, limit // 4)]))
    return str(prompt or "")[:limit]


_SYSTEM_ROLES = ("system", "developer")


def _chat_prefix(messages: Sequence[Any], user_turns: int, limit: int) -> str:
    parts: list[str] = []
    size = 0
    users = 0
    has_system = False
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = str(message.get("role") or "")
        if role in _SYSTEM_ROLES:
            has_system = True
        elif has_system and users >= user_turns:
            break  # the system part (and the user turns asked for) is the key
        piece = f"{role}\x1f{_content_text(message.get('content'), limit - size)}\x1e"
        parts.append(piece)
        size += len(piece)
        if size >= limit:
            break
        if role == "user":
            users += 1
            if users >= max(user_turns, 1):
                break
    return "".join(parts)[:limit]


def _content_text(content: Any, limit: int) -> str:
    """A message's text: a string, or the text parts of a multi-part content list (images
    and audio count by their URL or data, which is what identifies them)."""
    if limit <= 0:
        return ""
    if isinstance(content, str):
        return content[:limit]
    if not isinstance(content, list):
        return "" if content is None else str(content)[:limit]
    out: list[str] = []
    size = 0
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        value = part.get("text") if kind == "text" else part.get(str(kind))
        if isinstance(value, Mapping):
            value = value.get("url") or value.get("data")
        text = "" if value is None else str(value)[: limit - size]
        out.append(text)
        size += len(text)
        if size >= limit:
            break
    return "\x1d".join(out)


def prompt_chars(body: Mapping[str, Any]) -> tuple[int, int]:
    """(characters of a request's prompt content, characters of it before its last
    message): the prompt's size and the part a destination that served the conversation's
    previous turn holds cached (its history; for a first turn, the system prompt and
    documents ahead of the question). A completions prompt is all one message: its size,
    and 0. Counts lengths only, copies no text; /4 is the gateway's tokens estimate."""
    messages = body.get("messages")
    if isinstance(messages, list):
        total = last = 0
        for message in messages:
            last = _content_chars(message.get("content")) if isinstance(message, Mapping) else 0
            total += last
        return total, total - last
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt), 0
    if isinstance(prompt, list):
        if prompt and isinstance(prompt[0], str):  # a batch: its first prompt
            return len(prompt[0]), 0
        return 4 * len(prompt), 0  # token ids (4 characters each, as keys count them)
    return 0, 0


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part["text"]) for part in content
                   if isinstance(part, Mapping) and isinstance(part.get("text"), str))
    return 0
