"""Errors raised by the planning core.

    PlanningError (ValueError)   the inputs cannot make a plan: bad config, rates or keys.
                                 The caller's fault; retrying with the same inputs fails again.
"""

from __future__ import annotations


class PlanningError(ValueError):
    """Invalid planning input (configuration, rates, keys or token sizes)."""
