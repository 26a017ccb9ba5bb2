"""Domain errors of the planner service, mapped to gRPC status codes in one place.

PlannerError
├── InvalidRequest   -> INVALID_ARGUMENT   (the caller sent something wrong)
├── NotFound         -> NOT_FOUND          (no such plan version / destination)
├── Conflict         -> FAILED_PRECONDITION (valid request, wrong state)
└── Unavailable      -> UNAVAILABLE        (not ready yet: no rates, Redis down; retry later)
"""

from __future__ import annotations


class PlannerError(Exception):
    """Base of the expected errors; anything else is a bug and maps to INTERNAL."""


class InvalidRequest(PlannerError):
    pass


class NotFound(PlannerError):
    pass


class Conflict(PlannerError):
    pass


class Unavailable(PlannerError):
    pass
