"""q_cap measured from the engines (planner_svc.control.capacity): a saturation knee sets it,
an unsaturated load can only raise it, and the operator's q_cap bounds it to [q/2, 2q]."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from planner_svc.control.capacity import (
    KNEE,
    SERVED,
    SLO,
    SLO_STEP,
    SLO_STEP_DWELL_S,
    MeasuredQCap,
    learned_q_cap,
    measured_q_cap,
    slo_step,
)


def test_knees_win_over_served_loads_and_their_median_is_the_fleets():
    assert measured_q_cap([8.0, 10.0, 30.0], [50.0]) == MeasuredQCap(10.0, KNEE, 3)
    assert measured_q_cap([], [4.0, 9.0, 0.0]) == MeasuredQCap(9.0, SERVED, 2)
    assert measured_q_cap([0.0], []) is None


def test_a_knee_moves_q_cap_either_way_a_served_load_only_up():
    assert learned_q_cap(20.0, MeasuredQCap(12.0, KNEE, 4)) == 12.0  # too high: lowered
    assert learned_q_cap(20.0, MeasuredQCap(30.0, KNEE, 4)) == 30.0
    assert learned_q_cap(20.0, MeasuredQCap(12.0, SERVED, 4)) == 20.0  # says only q >= 12
    assert learned_q_cap(20.0, MeasuredQCap(26.0, SERVED, 4)) == 26.0  # too low: raised
    assert learned_q_cap(20.0, MeasuredQCap(1.0, KNEE, 1)) == 10.0  # bounded to [q/2, 2q]
    assert learned_q_cap(20.0, MeasuredQCap(100.0, SERVED, 1)) == 40.0
    assert learned_q_cap(20.0, None) == 20.0


@given(q=st.floats(0.1, 1e4), value=st.floats(0.0, 1e6), knee=st.booleans())
def test_the_learned_q_cap_stays_within_a_factor_of_two(q, value, knee):
    got = learned_q_cap(q, MeasuredQCap(value, KNEE if knee else SERVED, 1))
    assert q / 2 <= got <= 2 * q
    if not knee:
        assert got >= q


def test_status_says_what_was_measured_and_what_plans_use():
    from planner_svc.cli.ops_view import render_q_cap

    q = {"configured": 60.0, "in_use": 45.0, "learning": True, "measured": 45.0,
         "source": "knee", "destinations": 6}
    assert render_q_cap(q) == (
        "configured 60/s; measured 45/s per unit of weight, the median capacity of 6 saturated "
        "destination(s); planning with 45/s (within [q/2, 2q])")
    served = {**q, "learning": False, "measured": 50.0, "source": "served"}
    assert render_q_cap(served).endswith("the most 6 unsaturated destination(s) carried: "
                                         "a lower bound")


def test_loads_that_broke_the_ttft_target_bound_q_cap_from_above():
    # The bound is the median of the destinations' breaking loads: one burst does not set it.
    assert measured_q_cap([], [], [3.0, 2.5, 0.4]) == MeasuredQCap(2.5, SLO, 3, 2.5)
    assert measured_q_cap([6.0], [5.0], [3.0]) == MeasuredQCap(6.0, KNEE, 1, 3.0)
    assert learned_q_cap(4.2, MeasuredQCap(2.5, SLO, 3, 2.5)) == 2.5  # from above: lowered
    assert learned_q_cap(4.2, MeasuredQCap(5.0, SERVED, 4, 2.5)) == 2.5  # no served load past it
    assert learned_q_cap(4.2, MeasuredQCap(6.0, KNEE, 1, 3.0)) == 3.0
    assert learned_q_cap(1.05, MeasuredQCap(2.0, SERVED, 4, 2.5)) == 2.0  # from below: raised
    assert learned_q_cap(4.2, MeasuredQCap(0.5, SLO, 1, 0.5)) == 2.1  # still within [q/2, 2q]
    assert learned_q_cap(4.2, MeasuredQCap(9.0, SLO, 1, 9.0)) == 4.2  # a bound never raises it


@given(q=st.floats(0.1, 1e4), value=st.floats(0.0, 1e6), bound=st.floats(0.01, 1e6),
       source=st.sampled_from([KNEE, SERVED, SLO]))
def test_the_ttft_bound_only_ever_lowers_the_learned_q_cap(q, value, bound, source):
    free = learned_q_cap(q, MeasuredQCap(value, source, 1))
    got = learned_q_cap(q, MeasuredQCap(value, source, 1, bound))
    assert q / 2 <= got <= free
    assert got <= max(q / 2, bound) + 1e-9


def test_breaks_that_persist_step_the_bound_down_once_per_dwell():
    dwell_ms = int(SLO_STEP_DWELL_S * 1000)
    first = slo_step(None, 4.2, 1_000)
    assert first == (float("inf"), 1_000)  # the dwell starts; the breaking load bounds q_cap
    assert slo_step(first, 4.2, 1_000 + dwell_ms - 1) == first  # within the dwell: nothing
    second = slo_step(first, 3.7, 1_000 + dwell_ms)
    assert second == (SLO_STEP * 3.7, 1_000 + dwell_ms)
    third = slo_step(second, second[0], 1_000 + 2 * dwell_ms)
    assert third[0] == SLO_STEP * second[0]  # each step from the q_cap in use
    assert slo_step(third, 9.0, 1_000 + 3 * dwell_ms)[0] == third[0]  # never back up


def test_the_stepped_bound_joins_the_breaking_loads_and_only_lowers():
    assert measured_q_cap([], [], [3.7], 3.15) == MeasuredQCap(3.15, SLO, 1, 3.15)
    assert measured_q_cap([], [], [3.0], 3.15) == MeasuredQCap(3.0, SLO, 1, 3.0)
    assert measured_q_cap([], [5.4], [], 2.7) == MeasuredQCap(5.4, SERVED, 1, 2.7)
    assert measured_q_cap([], [], [], float("inf")) is None  # the dwell only started
    assert learned_q_cap(4.2, measured_q_cap([], [5.4], [3.7], 2.7)) == 2.7
    assert learned_q_cap(4.2, measured_q_cap([], [5.4], [3.7], 1.0)) == 2.1  # floor q/2
