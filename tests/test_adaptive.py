"""AdaptiveMaxAge: its update rule on synthetic metric streams, its checks, and live buffers whose max_age it moves."""

import math

import pytest
from _helpers import assert_balanced

from pyfast_buffer import ReferenceBuffer, StalenessBuffer
from pyfast_buffer.adaptive import AdaptiveMaxAge
from pyfast_buffer.experiment.batch_metrics import metric


class Holder:
    """A duck-typed buffer: only a max_age attribute, and a count of writes."""

    def __init__(self, max_age: int = 4) -> None:
        self._max_age = max_age
        self.writes = 0

    @property
    def max_age(self) -> int:
        return self._max_age

    @max_age.setter
    def max_age(self, value: int) -> None:
        self._max_age = value
        self.writes += 1


def _feed(ctl, kl_values):
    return [ctl.update({"approx_kl": kl}) for kl in kl_values]


def test_high_kl_halves_the_bound_down_to_min_and_low_kl_adds_one_up_to_max():
    buf = Holder(8)
    ctl = AdaptiveMaxAge(buf, target_kl=0.01, min_age=1, max_age=10, smoothing=1.0, cooldown=0)
    assert _feed(ctl, [0.1] * 5) == [4, 2, 1, 1, 1]  # multiplicative decrease, floored at min_age
    assert _feed(ctl, [0.001] * 12) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10, 10]  # additive increase, capped
    assert buf.max_age == 10 and buf.writes == ctl.changes == 3 + 9


def test_decrease_always_moves_at_least_one_step():
    ctl = AdaptiveMaxAge(Holder(3), target_kl=0.01, min_age=0, max_age=8, decrease=0.9, smoothing=1.0, cooldown=0)
    assert _feed(ctl, [1.0, 1.0, 1.0, 1.0]) == [2, 1, 0, 0]  # floor(3 * 0.9) = 2, then 1 (not stuck at 1), 0


def test_dead_band_holds_and_only_leaving_it_moves_the_bound():
    buf = Holder(4)
    ctl = AdaptiveMaxAge(buf, target_kl=0.01, min_age=1, max_age=8, dead_band=0.25, smoothing=1.0, cooldown=0)
    inside = [0.0076, 0.0124, 0.01, 0.008, 0.012]  # all within +-25 % of the target
    assert _feed(ctl, inside) == [4] * 5 and buf.writes == 0
    assert ctl.update({"approx_kl": 0.0126}) == 2  # just above the band
    assert ctl.update({"approx_kl": 0.0074}) == 3  # just below it


def test_smoothing_filters_a_single_spike():
    ctl = AdaptiveMaxAge(Holder(4), target_kl=0.01, min_age=1, max_age=8, smoothing=0.2, cooldown=0)
    assert _feed(ctl, [0.01] * 5 + [0.02] + [0.01] * 5) == [4] * 11  # EMA peaks at 1.2x: inside the band
    assert ctl.signal == pytest.approx(1.0 + 0.2 * 0.8**5, rel=1e-9)


def test_cooldown_holds_after_a_change():
    ctl = AdaptiveMaxAge(Holder(8), target_kl=0.01, min_age=1, max_age=8, smoothing=1.0, cooldown=2)
    assert _feed(ctl, [0.1] * 7) == [4, 4, 4, 2, 2, 2, 1]


def test_converges_toward_the_bound_whose_kl_is_on_target():
    # A synthetic loop where KL grows with the bound: kl = 0.004 * max_age. On target (0.01) means 2.5, so the
    # bound must settle at 2 or 3 from either side and stay there.
    for start in (1, 8):
        buf = Holder(start)
        ctl = AdaptiveMaxAge(buf, target_kl=0.01, min_age=1, max_age=8, cooldown=1)
        for _ in range(60):
            ctl.update({"approx_kl": 0.004 * buf.max_age})
        tail = [age for _, age in ctl.history[-20:]]
        assert set(tail) <= {2, 3}, (start, ctl.history)


def test_both_targets_fall_on_either_and_rise_only_on_both():
    ctl = AdaptiveMaxAge(Holder(4), target_kl=0.01, target_clip=0.1, min_age=1, max_age=8, smoothing=1.0, cooldown=0)
    assert ctl.update({"approx_kl": 0.001, "clip_frac": 0.5}) == 2  # clip above: down
    assert ctl.update({"approx_kl": 0.001, "clip_frac": 0.1}) == 2  # clip on target: hold
    assert ctl.update({"approx_kl": 0.001, "clip_frac": 0.01}) == 3  # both below: up


def test_clip_target_alone_and_custom_keys():
    ctl = AdaptiveMaxAge(Holder(4), target_clip=0.1, clip_key="actor/pg_clipfrac", smoothing=1.0, cooldown=0)
    assert ctl.update({"actor/pg_clipfrac": 0.5}) == 2
    with pytest.raises(KeyError, match="actor/pg_clipfrac"):
        ctl.update({"clip_frac": 0.5})


def test_non_finite_metric_counts_as_above_target_and_does_not_poison_the_signal():
    ctl = AdaptiveMaxAge(Holder(8), target_kl=0.01, min_age=1, max_age=8, smoothing=0.5, cooldown=0)
    assert ctl.update({"approx_kl": math.nan}) == 4
    assert ctl.update({"approx_kl": 0.001}) == 5  # the signal restarts from the finite value
    assert math.isfinite(ctl.signal)


def test_initial_defaults_to_the_buffers_bound_clipped_into_range():
    buf = Holder(20)
    ctl = AdaptiveMaxAge(buf, target_kl=0.01, min_age=2, max_age=6)
    assert ctl.value == buf.max_age == 6 and buf.writes == 1
    assert AdaptiveMaxAge(Holder(4), target_kl=0.01, initial=3, min_age=1, max_age=6).value == 3


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, "no target"),
        ({"target_kl": 0}, ValueError, "target_kl=0"),
        ({"target_kl": math.nan}, ValueError, "target_kl=nan"),
        ({"target_clip": "0.1"}, ValueError, "target_clip='0.1'"),
        ({"target_kl": 0.01, "min_age": 5, "max_age": 2}, ValueError, "min_age=5 is above max_age=2"),
        ({"target_kl": 0.01, "min_age": -1}, ValueError, "min_age=-1"),
        ({"target_kl": 0.01, "max_age": 2.5}, TypeError, "max_age=2.5"),
        ({"target_kl": 0.01, "initial": 9, "max_age": 8}, ValueError, "initial=9 is outside"),
        ({"target_kl": 0.01, "dead_band": 1.0}, ValueError, "dead_band=1.0"),
        ({"target_kl": 0.01, "decrease": 1.0}, ValueError, "decrease=1.0"),
        ({"target_kl": 0.01, "smoothing": 0}, ValueError, "smoothing=0"),
        ({"target_kl": 0.01, "increase": 0}, ValueError, "increase=0"),
    ],
)
def test_bad_arguments_name_themselves_and_touch_nothing(kwargs, error, match):
    buf = Holder(4)
    with pytest.raises(error, match=match):
        AdaptiveMaxAge(buf, **kwargs)
    assert buf.max_age == 4 and buf.writes == 0


def test_a_buffer_without_max_age_is_refused():
    with pytest.raises(TypeError, match="has no max_age attribute"):
        AdaptiveMaxAge(object(), target_kl=0.01)


def _drive(cls):
    """put/take over 40 steps while the controller moves max_age; checks every step, returns the trace."""
    buf = cls(64, max_age=6, strategy="drop", max_uses=2)
    ctl = AdaptiveMaxAge(buf, target_kl=0.01, min_age=1, max_age=6, smoothing=1.0, cooldown=0)
    trace = []
    for step in range(40):
        buf.put(list(range(step * 4, step * 4 + 4)), step)
        batch = buf.take(4, current_step=step)
        assert len(batch) == 0 or int(batch.age.max()) <= buf.max_age  # the bound in force, not the first one
        trace.append((batch.traj_ids.tolist(), metric(batch, "dropped_stale"), buf.max_age))
        # high KL for the first 10 steps, then low: the bound falls to 1, then climbs back to 6
        ctl.update({"approx_kl": 0.05 if step < 10 else 0.002})
        led = assert_balanced(buf)
        assert led["max_age_changes"] == ctl.changes
    return trace


def test_controller_moves_a_live_buffer_mid_run(impl):
    trace = _drive(impl)
    assert min(age for _, _, age in trace) == 1 and trace[-1][2] == 6
    assert sum(dropped for _, dropped, _ in trace) > 0  # lowering the bound really dropped entries


def test_native_buffer_and_twin_agree_under_the_controller():
    assert _drive(StalenessBuffer) == _drive(ReferenceBuffer)
