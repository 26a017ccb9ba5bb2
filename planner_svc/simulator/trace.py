"""Recorded traffic as a replay workload: CSV / JSONL trace files and Kafka event exports.

Mooncake-style rows are read too: `timestamp` (milliseconds), `input_length`,
`output_length`, `hash_ids` (one hash per 512-token block of the prompt). Their content is
the hashes (the simulator shares exactly the blocks they share); their key is the first
block's hash (requests with the same first 512 tokens, the application's system prompt,
share it, as the gateway keys on the leading prefix); their reusable prefix is the leading
blocks some earlier request already had.

A trace row is one request: `timestamp` (seconds; or `timestamp_ms`), `key`, `prompt_tokens`,
and optionally `prefix_tokens` (the reusable prefix; alias `reusable_prefix_tokens`) and
`output_tokens`; and what happened to it, if recorded: `destination`, `cached_tokens` (served
from cache) and `e2e_ms` (what the fidelity gate checks the engine model against). Without
`prefix_tokens` the reusable prefix is taken to be the key's previous
prompt (capped at this prompt), the multi-turn assumption; without `output_tokens` a default
is used. Events exported from the `cacheroute.events` topic (serialized `EventBatch` values)
convert to the same rows with `rows_from_event_batches` (requests joined with their usage
events; a prompt size of 0 there means unknown). `cacheroute replay|diagnose --trace
kafka://HOST:PORT/TOPIC` reads such a topic.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cacheroute.v1 import events_pb2
from planner_svc.simulator.workload import Workload

DEFAULT_OUTPUT_TOKENS = 32
FIELDS = ("timestamp", "key", "prompt_tokens", "prefix_tokens", "output_tokens")


class TraceError(ValueError):
    """A trace file or row cannot be read; the message says which row and why."""


def read_rows(path: Path) -> list[dict[str, object]]:
    """Rows of a `.csv` or `.jsonl` trace file as dicts."""
    text = path.read_text()
    if path.suffix == ".jsonl" or text.lstrip().startswith("{"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return list(csv.DictReader(text.splitlines()))


MOONCAKE_BLOCK_TOKENS = 512


def workload_from_rows(rows: Sequence[dict[str, object]], name: str = "trace") -> Workload:
    """A Workload from trace rows (sorted by time; keys interned in first-seen order)."""
    if not rows:
        raise TraceError("the trace has no rows")
    if "hash_ids" in rows[0]:
        return _mooncake(rows, name)
    t, names, prompt, prefix, output = [], [], [], [], []
    dests: list[str] = []
    cached: list[int] = []
    e2e: list[float] = []
    for n, row in enumerate(rows):
        try:
            t.append(_timestamp(row))
            names.append(str(row["key"]))
            prompt.append(int(float(str(row["prompt_tokens"]))))
            prefix.append(_optional_int(row, ("prefix_tokens", "reusable_prefix_tokens")))
            output.append(_optional_int(row, ("output_tokens",)))
            dests.append(str(row.get("destination") or ""))
            cached.append(_optional_int(row, ("cached_tokens",)))
            e2e_ms = row.get("e2e_ms")
            e2e.append(float(str(e2e_ms)) / 1000.0 if e2e_ms not in (None, "") else math.nan)
        except (KeyError, ValueError) as exc:
            raise TraceError(f"row {n + 1}: {exc!r}") from exc
    order = np.argsort(np.asarray(t, np.float64), kind="stable")
    w = _assemble(name, order, t, names, prompt, prefix, output)
    return _with_outcomes(w, order, dests, cached, e2e)


def _with_outcomes(w: Workload, order: np.ndarray, dests: list[str], cached: list[int],
                   e2e: list[float]) -> Workload:
    """`w` with what the trace says happened, when it says anything."""
    if not any(dests) and max(cached, default=-1) < 0 and all(math.isnan(x) for x in e2e):
        return w
    ids: dict[str, int] = {}
    slot = np.fromiter((ids.setdefault(dests[i], len(ids)) if dests[i] else -1
                        for i in order.tolist()), np.int32, len(order))
    return dataclasses.replace(
        w, recorded_dest=slot, recorded_destinations=list(ids),
        measured_cached=np.asarray(cached, np.int64)[order],
        measured_e2e_s=np.asarray(e2e, np.float64)[order])


def _timestamp(row: dict[str, object]) -> float:
    if row.get("timestamp") not in (None, ""):
        return float(str(row["timestamp"]))
    return float(str(row["timestamp_ms"])) / 1000.0


def _optional_int(row: dict[str, object], names: Sequence[str]) -> int:
    for name in names:
        value = row.get(name)
        if value not in (None, ""):
            return int(float(str(value)))
    return -1


def _assemble(
    name: str,
    order: np.ndarray,
    t: list[float],
    names: list[str],
    prompt: list[int],
    prefix: list[int],
    output: list[int],
) -> Workload:
    ids: dict[str, int] = {}
    key = np.fromiter((ids.setdefault(names[i], len(ids)) for i in order), np.int64, len(order))
    p = np.asarray(prompt, np.int64)[order]
    pre = np.asarray(prefix, np.int64)[order]
    out = np.asarray(output, np.int64)[order]
    pre = np.where(pre >= 0, np.minimum(pre, p), _previous_prompt(key, p))
    out = np.where(out >= 0, out, DEFAULT_OUTPUT_TOKENS)
    times = np.asarray(t, np.float64)[order]
    return Workload(
        name=name,
        t=times - times[0],
        key=key.astype(np.int32),
        prompt=p.astype(np.int32),
        prefix=pre.astype(np.int32),
        output=out.astype(np.int32),
        keys=list(ids),
        interval_s=300.0,
        notes={"source": "recorded trace", "requests": str(len(order))},
    )


def _previous_prompt(key: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """For each request, its key's previous prompt length capped at its own (0 for the first)."""
    last: dict[int, int] = {}
    out = np.zeros(len(key), np.int64)
    for i, (k, p) in enumerate(zip(key.tolist(), prompt.tolist(), strict=True)):
        out[i] = min(last.get(k, 0), p)
        last[k] = p
    return out


def _mooncake(rows: Sequence[dict[str, object]], name: str) -> Workload:
    t, names, prompt, output, blocks = [], [], [], [], []
    for n, row in enumerate(rows):
        try:
            hashes = row["hash_ids"]
            if not isinstance(hashes, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in hashes):
                raise ValueError("hash_ids is not a list of integers")
            length = int(float(str(row["input_length"])))
            if length < 0 or len(hashes) * MOONCAKE_BLOCK_TOKENS < length - MOONCAKE_BLOCK_TOKENS:
                raise ValueError(f"{len(hashes)} hash ids cannot cover {length} tokens")
            t.append(float(str(row["timestamp"])) / 1000.0)
            names.append(f"mc:{hashes[0]}" if hashes else "mc:empty")
            prompt.append(length)
            output.append(int(float(str(row.get("output_length", DEFAULT_OUTPUT_TOKENS)))))
            blocks.append(tuple(hashes))
        except (KeyError, ValueError, TypeError) as exc:
            raise TraceError(f"row {n + 1}: {exc}") from exc
    order = np.argsort(np.asarray(t, np.float64), kind="stable")
    # Reusable prefix: the leading blocks some earlier request (in arrival order) already
    # had. Each chain prefix is remembered as one 64-bit fingerprint of its hashes.
    seen: set[int] = set()
    reusable = [0] * len(rows)
    for i in order.tolist():
        fingerprint, shared, extending = 0, 0, True
        for h in blocks[i]:
            fingerprint = hash((fingerprint, h))
            if extending and fingerprint in seen:
                shared += 1
            else:
                extending = False
                seen.add(fingerprint)
        reusable[i] = min(shared * MOONCAKE_BLOCK_TOKENS, prompt[i])
    w = _assemble(name, order, t, names, prompt, reusable, output)
    return dataclasses.replace(
        w, blocks=[blocks[i] for i in order.tolist()],
        hash_block_tokens=MOONCAKE_BLOCK_TOKENS,
        notes={**w.notes, "source": "recorded trace (Mooncake format: block hashes)"})


def load_trace(path: Path) -> Workload:
    return workload_from_rows(read_rows(path), name=path.stem)


def write_trace(w: Workload, path: Path) -> None:
    """Write `w` as a CSV trace (the format `load_trace` reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS)
        for t, k, p, pre, o in zip(
            w.t.tolist(),
            w.key.tolist(),
            w.prompt.tolist(),
            w.prefix.tolist(),
            w.output.tolist(),
            strict=True,
        ):
            writer.writerow((f"{t:.6f}", w.keys[k], p, pre, o))


def rows_from_event_batches(payloads: Iterable[bytes]) -> list[dict[str, object]]:
    """Trace rows from serialized `EventBatch` values exported from the events topic.

    A router emits a request's `RequestEvent` when it dispatches it, before the engine has
    counted the prompt (its `prompt_tokens` is then 0: *unknown*, not an empty prompt), and
    its `CacheHitEvent` when the response ends, with the served prompt, cached and output
    tokens and the end-to-end time. The two are joined per (router, key, destination) in
    time order: a usage event completes the oldest open request of its triple. A request
    that never got one (failed, or still running at the export) takes the median prompt of
    its key's known requests, else of all (`prompt_imputed` says so); a usage event without
    its request (its request fell before the export's start) is a row of its own, at its
    end time minus its end-to-end time. Events repeated by producer retries count once."""
    requests: list[dict[str, object]] = []
    usage: list[tuple[float, tuple[str, str, str], events_pb2.CacheHitEvent]] = []
    seen: set[tuple[str, int]] = set()
    for payload in payloads:
        batch = events_pb2.EventBatch()
        batch.ParseFromString(payload)
        for ev in batch.events:
            ident = (ev.producer_id, ev.sequence)
            if ident in seen:
                continue
            seen.add(ident)
            body = ev.WhichOneof("body")
            if body == "request":
                r = ev.request
                requests.append({
                    "timestamp_ms": ev.timestamp_ms, "key": r.routing_key,
                    "prompt_tokens": r.prompt_tokens,
                    "prefix_tokens": r.reusable_prefix_tokens or "",
                    "output_tokens": "", "destination": r.destination,
                    "_triple": (ev.producer_id, r.routing_key, r.destination)})
            elif body == "cache_hit":
                h = ev.cache_hit
                usage.append((float(ev.timestamp_ms), (ev.producer_id, h.routing_key,
                                                        h.destination), h))
    requests.sort(key=lambda row: float(str(row["timestamp_ms"])))
    usage.sort(key=lambda u: u[0])
    open_requests: dict[tuple[str, str, str], deque[dict[str, object]]] = {}
    rows: list[dict[str, object]] = []
    i = 0
    for end_ms, triple, h in usage:
        while i < len(requests) and float(str(requests[i]["timestamp_ms"])) <= end_ms:
            row = requests[i]
            open_requests.setdefault(row.pop("_triple"), deque()).append(row)  # type: ignore[arg-type]
            rows.append(row)
            i += 1
        queue = open_requests.get(triple)
        if queue:
            row = queue.popleft()
        else:
            row = {"timestamp_ms": end_ms - float(h.e2e_ms), "key": h.routing_key,
                   "prompt_tokens": 0, "prefix_tokens": "", "output_tokens": "",
                   "destination": h.destination}
            rows.append(row)
        if h.prompt_tokens:
            row["prompt_tokens"] = h.prompt_tokens
            row["cached_tokens"] = h.cached_tokens
        if h.output_tokens:
            row["output_tokens"] = h.output_tokens
        if h.e2e_ms > 0:
            row["e2e_ms"] = h.e2e_ms
    for row in requests[i:]:
        row.pop("_triple")
        rows.append(row)
    _impute_unknown_prompts(rows)
    return rows


def _impute_unknown_prompts(rows: list[dict[str, object]]) -> None:
    known: dict[str, list[int]] = {}
    for row in rows:
        if int(str(row["prompt_tokens"])) > 0:
            known.setdefault(str(row["key"]), []).append(int(str(row["prompt_tokens"])))
    if not known:
        if rows:
            raise TraceError("no event carries a prompt size (no usage events in the export)")
        return
    overall = int(np.median([p for ps in known.values() for p in ps]))
    for row in rows:
        unknown = int(str(row["prompt_tokens"])) <= 0
        row["prompt_imputed"] = unknown
        if unknown:
            ps = known.get(str(row["key"]))
            row["prompt_tokens"] = int(np.median(ps)) if ps else overall
