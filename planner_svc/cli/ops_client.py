"""The operator CLI's connection to the planner: one gRPC channel, errors translated once.

Every failure a command can meet becomes `OpsError(message, exit_code)`: the message is one
line for stderr, the exit code says whose fault it is (see `planner_svc.cli.ops`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from cacheroute.v1 import planner_pb2_grpc

DEFAULT_PLANNER = "127.0.0.1:50051"
# Exit status by gRPC code; anything else is 1.
_EXIT = {
    grpc.StatusCode.INVALID_ARGUMENT: 2,
    grpc.StatusCode.OUT_OF_RANGE: 2,
    grpc.StatusCode.UNAVAILABLE: 3,
    grpc.StatusCode.DEADLINE_EXCEEDED: 3,
    grpc.StatusCode.UNAUTHENTICATED: 4,
    grpc.StatusCode.PERMISSION_DENIED: 4,
}


class OpsError(Exception):
    """A failure to report in one line, with the exit status to end on."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- the connection -------------------------------------------------------------------


class PlannerConnection:
    """A channel and stub to one planner; translates gRPC errors into `OpsError` once."""

    def __init__(self, target: str, token: str = "", tls_ca: str = "", timeout_s: float = 10.0,
                 pool: str = ""):
        self.target = target
        self.pool = pool  # every call is about this pool ("" = the default or only one)
        self.timeout_s = timeout_s
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        if tls_ca:
            creds = grpc.ssl_channel_credentials(root_certificates=_read(tls_ca))
            self._channel = grpc.secure_channel(target, creds)
        else:
            self._channel = grpc.insecure_channel(target)
        self.stub = planner_pb2_grpc.PlannerStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def call(self, method: str, request: Any, *, retries: int = 0) -> Any:
        """A unary call; mutations pass `retries` (their request id makes a retry act once)."""
        self._aim(request)
        for attempt in range(retries + 1):
            try:
                return getattr(self.stub, method)(
                    request, metadata=self._metadata, timeout=self.timeout_s
                )
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.UNAVAILABLE and attempt < retries:
                    time.sleep(0.5 * (attempt + 1))
                    continue
                raise self.error(exc) from None
        raise AssertionError("unreachable")

    def stream(
        self, method: str, request: Any, timeout_s: float | None = None, *, until: bool = False
    ) -> Iterator[Any]:
        """A server stream; with `until`, reaching `timeout_s` ends it quietly (watch)."""
        self._aim(request)
        try:
            yield from getattr(self.stub, method)(
                request, metadata=self._metadata, timeout=timeout_s
            )
        except grpc.RpcError as exc:
            ended = until and exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            if ended or exc.code() is grpc.StatusCode.CANCELLED:
                return
            raise self.error(exc) from None

    def _aim(self, request: Any) -> None:
        if self.pool and "pool" in request.DESCRIPTOR.fields_by_name:
            request.pool = self.pool

    def error(self, exc: grpc.RpcError) -> OpsError:
        code, details = exc.code(), exc.details() or ""
        if code is grpc.StatusCode.UNAVAILABLE and _is_transport(details):
            why = _first_line(details)
            return OpsError(f"cannot reach the planner at {self.target}: {why}", 3)
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            wait = f"{self.timeout_s:g}s"
            return OpsError(f"the planner at {self.target} did not answer in {wait}", 3)
        if code is grpc.StatusCode.UNAUTHENTICATED:
            hint = "(pass --token or set CACHEROUTE_TOKEN)"
            return OpsError(f"unauthenticated: {details} {hint}", 4)
        if code is grpc.StatusCode.PERMISSION_DENIED:
            return OpsError(f"permission denied: {details} (use the operator token)", 4)
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            return OpsError(f"invalid value: {details}", 2)
        label = code.name.lower().replace("_", " ")
        return OpsError(f"{label}: {_first_line(details)}", _EXIT.get(code, 1))


def _is_transport(details: str) -> bool:
    words = ("connect", "DNS", "Socket", "socket", "unreachable", "refused", "handshake")
    return any(w in details for w in words)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no details)"


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OpsError(f"cannot read {path}: {exc.strerror}", 2) from None


def connect(args: argparse.Namespace) -> PlannerConnection:
    return PlannerConnection(args.planner, args.token, args.tls_ca, args.timeout,
                             getattr(args, "pool", ""))
