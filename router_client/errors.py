"""Errors raised by the router client.

RouterClientError
├── PlanRejected      a plan or delta failed decoding, digest, signature or sanity checks
├── NoPlanAvailable   asked for the plan before any valid one was applied
└── SourceUnavailable the plan source cannot be reached now (the client retries)
"""

from __future__ import annotations


class RouterClientError(Exception):
    """Base of every error this package raises."""


class PlanRejected(RouterClientError):
    """A plan was refused; `reason` is a short machine-readable word for metrics."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class NoPlanAvailable(RouterClientError):
    """No valid plan has been applied yet."""


class SourceUnavailable(RouterClientError):
    """The plan source cannot be reached now; keep the last good plan and retry."""
