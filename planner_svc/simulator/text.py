"""Real text as the emulated engines see it: a chat template, a tokenizer, block chains and
deterministic answers (pure).

The emulator serves real OpenAI requests, so peers that route on text (SGLang's and
vLLM's cache-aware radix trees) and CacheRoute's keys see the same content the engine
caches. The engine's view of a prompt:
- chat messages render through a fixed template,
  `<|role|>\\n content <|end|>\\n` per message, then `<|assistant|>\\n`; a completions
  prompt is used as it is;
- a token is 4 bytes of the rendered UTF-8 (about an English word piece), so
  `tokens(text) = ceil(bytes / 4)`;
- a block is `block_tokens` tokens; its segment id hashes the previous block's id with the
  block's bytes, so equal prefixes give equal chains and a chain diverges at the first
  differing block, as vLLM's block hashes do;
- an answer of n tokens is n 4-byte words drawn from a generator seeded by the prompt, so
  the same request gets the same answer; it continues the prompt's byte stream, and
  `answer_chain` gives the blocks the answer completes, which is what the next turn
  (prompt + answer + new message) finds cached.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from planner_svc.simulator.kvcache import Chain

BYTES_PER_TOKEN = 4
_MASK = (1 << 62) - 1
_WORDS = [f"{c}{d}{e} " for c in "bcdfghjklmnprstvwz" for d in "aeiou" for e in "lmnrst"]


def render_chat(messages: Iterable[Mapping[str, Any]], *, generation_prompt: bool = True) -> str:
    parts = []
    for message in messages:
        role = str(message.get("role") or "user")
        parts.append(f"<|{role}|>\n{content_text(message.get('content'))}<|end|>\n")
    if generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def token_count(data: bytes) -> int:
    return -(-len(data) // BYTES_PER_TOKEN)


def block_chain(data: bytes, block_tokens: int, start: int = 0, parent: int = 0) -> list[int]:
    """Segment ids of the full blocks of `data[start:]`, chained from `parent`."""
    size = block_tokens * BYTES_PER_TOKEN
    ids = []
    for offset in range(start, len(data) - size + 1, size):
        digest = hashlib.blake2b(data[offset:offset + size], digest_size=8,
                                 key=parent.to_bytes(8, "little")).digest()
        parent = int.from_bytes(digest, "little") & _MASK
        ids.append(parent)
    return ids


def as_chain(ids: Sequence[int]) -> Chain:
    """1-block segments."""
    return [(i, 1) for i in ids]


def answer_text(prompt: bytes, tokens: int) -> str:
    """`tokens` 4-byte words, the same for the same prompt."""
    rng = random.Random(hashlib.blake2b(prompt, digest_size=8).digest())
    return "".join(rng.choice(_WORDS) for _ in range(tokens))


def answer_chain(prompt: bytes, answer: bytes, prompt_ids: Sequence[int],
                 block_tokens: int) -> list[int]:
    """Segment ids of the blocks completed by the answer: the blocks of prompt + answer
    after the prompt's own full blocks."""
    size = block_tokens * BYTES_PER_TOKEN
    start = len(prompt_ids) * size
    parent = prompt_ids[-1] if prompt_ids else 0
    return block_chain(prompt + answer, block_tokens, start, parent)
