"""Conversation placements shared between the replicas of a router (pure: the wire format).

Each router remembers where each conversation's last turn went, so the next turn meets its
history in that destination's cache (`RouterCore`, `history_slack`). Behind a load balancer
that spreads requests over several routers, the next turn usually reaches *another*
replica, which never saw the conversation and places it afresh by load: measured in the
arena (docs/arena.md), four gateways served 3 pp fewer prompt tokens from cache than one
when each turn went to the next gateway, and 0.8 pp more when each conversation kept to one
gateway. So replicas tell each other where they placed conversations.

A message is one JSON object on the plan namespace's history channel
(`Layout.history_channel`):

    {"v": 1, "router": "<sender id>", "moves": [["<affinity>", "<destination id>"], ...]}

Only placements that changed are sent (a new conversation, or one the load rule moved),
about one per conversation, in batches every `period_s` (a next turn comes after a whole
answer, seconds later). Affinities are the gateway's conversation digests
(`router_client.keys.conversation_id`), so no prompt text leaves the router.

Anyone who can publish on the channel can steer where conversations' next turns go, but only
within the same load bound as the router's own memory (`history_slack`), and only among
destinations the router already knows: the harm is cache misses, never an unknown address
or an overload. `decode_moves` bounds every size and refuses anything else with
`SharedHistoryError`; the shell counts and drops those.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

WIRE_VERSION = 1
MAX_MESSAGE_BYTES = 256 << 10
MAX_MOVES_PER_MESSAGE = 2_000
MAX_ID_CHARS = 128  # an affinity digest is 16; a destination id as plans bound it


class SharedHistoryError(ValueError):
    """A history message that is not one this module writes."""


def encode_moves(router_id: str, moves: Sequence[tuple[str, str]]) -> list[bytes]:
    """The messages that carry `moves`, each within the limits `decode_moves` enforces."""
    return [
        json.dumps({"v": WIRE_VERSION, "router": router_id,
                    "moves": [list(m) for m in moves[i:i + MAX_MOVES_PER_MESSAGE]]},
                   separators=(",", ":")).encode()
        for i in range(0, len(moves), MAX_MOVES_PER_MESSAGE)
    ]


def decode_moves(raw: bytes | str) -> tuple[str, list[tuple[str, str]]]:
    """(sender router id, moves) of one message."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise SharedHistoryError(f"message of {len(raw)} bytes (limit {MAX_MESSAGE_BYTES})")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SharedHistoryError(f"not JSON: {exc}") from None
    if not isinstance(body, dict) or body.get("v") != WIRE_VERSION:
        raise SharedHistoryError("not a version-1 history message")
    router, moves = body.get("router"), body.get("moves")
    if not _is_id(router):
        raise SharedHistoryError("missing or bad router id")
    if not isinstance(moves, list) or len(moves) > MAX_MOVES_PER_MESSAGE:
        raise SharedHistoryError(f"moves must be a list of at most {MAX_MOVES_PER_MESSAGE}")
    out: list[tuple[str, str]] = []
    for move in moves:
        if not (isinstance(move, list) and len(move) == 2
                and _is_id(move[0]) and _is_id(move[1])):
            raise SharedHistoryError(f"a move is [affinity, destination id], got {move!r:.80}")
        out.append((move[0], move[1]))
    return router, out  # type: ignore[return-value]


def _is_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS
