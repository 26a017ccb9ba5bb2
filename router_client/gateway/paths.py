"""Request targets as the gateway forwards them (pure).

A target is forwarded to an engine only in its normal form: empty segments collapsed
(`//v1//models` is `/v1/models`) and no dot segment (`.` or `..`), also none spelled with
percent-escapes (`%2e%2e`, `.%2E`), with an escaped slash (`..%2f`) or a backslash (which
some servers take for a slash), however often escaped: a dot segment would take a client
outside `/v1/` on the engine (`/v1/../metrics` is the engine's own `/metrics`), or wherever
a server behind it resolves `/v1/../../etc/passwd`. The query is forwarded as it came.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_SEPARATORS = re.compile(r"[/\\]+")
_SLASHES = re.compile(r"/{2,}")
_UNESCAPE_ROUNDS = 4  # a target escaped more often than this is refused


def normal_target(target: str) -> str | None:
    """`target` (path and query) with its path normalised; None when the path has a dot
    segment in any of its spellings (the client gets 400: nothing is forwarded)."""
    if not ("." in target or "%" in target or "\\" in target or "//" in target):
        return target  # the common case: nothing to look at
    path, sep, query = target.partition("?")
    if ("." in path or "%" in path or "\\" in path) and _dot_segment(path):
        return None
    if "//" not in path:
        return target
    return f"{_SLASHES.sub('/', path)}{sep}{query}"


def _dot_segment(path: str) -> bool:
    seen = path
    for _ in range(_UNESCAPE_ROUNDS):
        if any(part in (".", "..") for part in _SEPARATORS.split(seen)):
            return True
        decoded = unquote(seen)
        if decoded == seen:
            return False
        seen = decoded
    return True  # still escaped after every round: not a target an OpenAI client sends
