"""The arena's capacity statistics (bench/arena.py): the p99 interval and the median of
sweeps over seeds."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.bench_module import load_bench

arena = load_bench("arena")


def samples(n: int, per_conversation: int, seed: int = 1) -> list[tuple[int, float]]:
    """Turns of a conversation share its slowness (one cache, one destination)."""
    r = random.Random(seed)
    out = []
    for sid in range(n // per_conversation):
        slow = r.expovariate(1.0)
        out += [(sid, slow + 0.1 * r.random()) for _ in range(per_conversation)]
    return out


def test_the_p99_interval_holds_the_sample_p99_and_narrows_with_more_requests() -> None:
    few, many = samples(500, 1), samples(20_000, 1)
    for s in (few, many):
        lo, hi = arena.p99_interval(s)
        assert lo <= np.percentile([v for _, v in s], 99) <= hi
    assert np.subtract(*arena.p99_interval(many)[::-1]) < np.subtract(
        *arena.p99_interval(few)[::-1])


def test_too_few_samples_give_no_interval() -> None:
    assert all(np.isnan(arena.p99_interval([(1, 0.5)])))


def sweep(first_load: float) -> list[dict]:
    return [{"sessions_per_s": first_load}]


@pytest.mark.parametrize(("values", "middle"), [
    ([2.5, 3.0, 2.8], 2),          # plain values: the middle one
    ([0.0, 3.0, 2.8], 2),          # a sweep that missed at its first point ranks lowest
    ([0.0, 0.0, 2.8], 0),          # two of them: the middle is a bound
    ([3.0, 2.0], 1),               # an even count: the lower middle
])
def test_the_middle_seed_ranks_bounds_and_never_averages(values: list[float],
                                                         middle: int) -> None:
    sweeps = [sweep(2.25) for _ in values]
    picked = arena._middle_seed(values, sweeps)
    if middle == 0:
        assert values[picked] == 0.0
    else:
        assert values[picked] == values[middle]
