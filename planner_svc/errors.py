"""Domain errors of the planner service, mapped to gRPC status codes in one place.

PlannerError
├── InvalidRequest   -> INVALID_ARGUMENT   (the caller sent something wrong)
├── NotFound         -> NOT_FOUND          (no such plan version / destination)
├── Conflict         -> FAILED_PRECONDITION (valid request, wrong state)
├── Unavailable      -> UNAVAILABLE        (not ready yet: no rates, Redis down; retry later)
│   └── NotLeader                          (a standby planner, or one that lost its lease:
│                                           the message names the leader; retry there)
└── Busy             -> RESOURCE_EXHAUSTED (too many streams open; retry later)

PublishError (the plan store refused an install; raised by the Redis adapter)
├── VersionRegression
└── VersionConflict

CorruptPointer (Unavailable): the current-version key holds something that is not a pointer
to a retained plan (junk, a version past what exists); the planner repairs it.
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


class NotLeader(Unavailable):
    """This planner does not hold the leader lease: it does not install or change config."""


class PublishError(RuntimeError):
    """Redis refused an install: the message says why (backwards, reused version)."""


class VersionRegression(PublishError):
    """The version is older than the installed one."""


class VersionConflict(PublishError):
    """The version was already installed with different bytes."""


class CorruptPointer(Unavailable):
    """The current-version pointer is unparseable or names a plan that is not stored."""


class Busy(PlannerError):
    """A bounded resource (watch streams) is full."""
