"""One place for the policy every RPC shares: authentication, roles, error mapping, audit.

- Tokens come as `authorization: Bearer <token>` metadata, compared in constant time.
  As soon as any token is configured, mutating RPCs need the operator token (no
  credentials -> UNAUTHENTICATED, a reader's token -> PERMISSION_DENIED; with only a
  reader token configured nobody may mutate: auth cannot be half-configured open). With a
  reader token configured, reads need either token.
- Expected domain errors map to status codes here, so handlers just raise.
- Every mutation is audit-logged with the caller's role, peer and request.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import text_format

from planner_svc.errors import (
    Busy,
    Conflict,
    InvalidRequest,
    NotFound,
    PlannerError,
    Unavailable,
)
from planner_svc.planning import PlanningError

audit = logging.getLogger("cacheroute.audit")
log = logging.getLogger("cacheroute.planner.rpc")

MUTATIONS = frozenset({"Replan", "Rollback", "SetMode", "UpdateConfig"})
# Server reflection streams open at once. Each holds one of the server's threads for as
# long as the client keeps it open (sending nothing costs the client nothing), and
# reflection sits outside the Planner service's watch cap: 24 idle ones took every thread,
# and GetStatus and health checks timed out.
REFLECTION_STREAMS = 2

MAX_REQUEST_ID_CHARS = 128
_CODES: list[tuple[type[Exception], grpc.StatusCode]] = [
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (PlanningError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (Busy, grpc.StatusCode.RESOURCE_EXHAUSTED),
]


def status_for(exc: Exception) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _bearer(context: Any) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return ""


class PlannerInterceptor(grpc.ServerInterceptor):
    def __init__(self, *, operator_token: str = "", reader_token: str = "") -> None:
        self._operator = operator_token
        self._reader = reader_token
        self._reflection = threading.BoundedSemaphore(REFLECTION_STREAMS)

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        service, _, method = details.method.rpartition("/")
        if handler is not None and handler.stream_stream is not None and service.lstrip(
                "/").startswith("grpc.reflection."):
            return grpc.stream_stream_rpc_method_handler(
                self._limited(handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler is None or not service.endswith("cacheroute.v1.Planner"):
            return handler
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    def _limited(self, fn: Callable[[Any, Any], Iterator[Any]]
                 ) -> Callable[[Any, Any], Iterator[Any]]:
        def handle(requests: Any, context: Any) -> Iterator[Any]:
            if not self._reflection.acquire(blocking=False):
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"at most {REFLECTION_STREAMS} reflection streams at once")
            try:
                yield from fn(requests, context)
            finally:
                self._reflection.release()
        return handle

    def _role(self, context: Any) -> str:
        token = _bearer(context).encode("utf-8", "surrogatepass")
        if self._operator and hmac.compare_digest(token, self._operator.encode()):
            return "operator"
        if self._reader and hmac.compare_digest(token, self._reader.encode()):
            return "reader"
        if not self._operator and not self._reader:
            return "operator"  # auth switched off: everybody may do everything
        return "anonymous" if not token else "unknown"

    def _authorize(self, method: str, context: Any) -> str:
        role = self._role(context)
        needs_operator = method in MUTATIONS and bool(self._operator or self._reader)
        needs_reader = bool(self._reader) or needs_operator
        if role in ("anonymous", "unknown") and needs_reader:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "a valid bearer token is required (authorization: Bearer <token>)",
            )
        if needs_operator and role != "operator":
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method} changes the plan and needs the operator role",
            )
        return role

    def _fail(self, method: str, exc: Exception, context: Any) -> None:
        code = status_for(exc)
        if code is grpc.StatusCode.INTERNAL:
            log.exception("%s failed", method)
            context.abort(code, f"internal error in {method}: {type(exc).__name__}")
        context.abort(code, str(exc))

    def _audit(self, method: str, role: str, request: Any, context: Any) -> None:
        if method in MUTATIONS:
            audit.info(
                "%s by %s from %s: %s",
                method,
                role,
                context.peer(),
                text_format.MessageToString(request, as_one_line=True),
            )

    def _wrap_unary(self, method: str, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def handle(request: Any, context: Any) -> Any:
            role = self._authorize(method, context)
            rid = getattr(request, "request_id", "")
            if len(rid) > MAX_REQUEST_ID_CHARS:  # before it reaches the audit log
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters")
            self._audit(method, role, request, context)
            try:
                return fn(request, context)
            except (PlannerError, PlanningError, ValueError) as exc:
                self._fail(method, exc, context)
            except Exception as exc:
                if isinstance(exc, grpc.RpcError) or type(exc).__name__ == "_AbortError":
                    raise
                self._fail(method, exc, context)
            return None

        return handle

    def _wrap_stream(
        self, method: str, fn: Callable[[Any, Any], Iterator[Any]]
    ) -> Callable[[Any, Any], Iterator[Any]]:
        def handle(request: Any, context: Any) -> Iterator[Any]:
            self._authorize(method, context)
            try:
                yield from fn(request, context)
            except (PlannerError, PlanningError, ValueError) as exc:
                self._fail(method, exc, context)

        return handle
