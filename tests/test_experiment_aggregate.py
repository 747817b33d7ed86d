"""The multi-seed numbers: the bootstrap interval on known data, the separation rule, and the report's use of it."""

import numpy as np
import pytest

from pyfast_buffer.experiment import aggregate as agg_mod
from pyfast_buffer.experiment.aggregate import RESAMPLES, bootstrap_interval, separated
from pyfast_buffer.experiment.report_seeds import differences
from pyfast_buffer.experiment.seeds import parse_seeds


def test_bootstrap_interval_of_constant_data_is_a_point():
    assert bootstrap_interval([0.5] * 5) == (0.5, 0.5, 0.5)
    assert bootstrap_interval([3.0]) == (3.0, 3.0, 3.0)


def test_bootstrap_interval_matches_the_normal_interval_on_many_values():
    # 400 draws: the bootstrap distribution of the mean is close to normal with sd = s / sqrt(n)
    # (population s, as the bootstrap resamples the empirical distribution), so the 95% interval is
    # mean +- 1.96 s / sqrt(n) to within a few percent of its half-width.
    x = np.random.default_rng(7).exponential(size=400)
    mean, low, high = bootstrap_interval(x)
    half = 1.96 * x.std() / np.sqrt(x.size)
    assert mean == pytest.approx(x.mean())
    assert low == pytest.approx(mean - half, abs=0.1 * half)
    assert high == pytest.approx(mean + half, abs=0.1 * half)


def test_bootstrap_interval_of_two_points_is_the_percentiles_of_the_binomial_means():
    # values {0, 1}: a resample's mean is k/2 with k ~ Binomial(2, 1/2): 0 w.p. 1/4, 0.5 w.p. 1/2, 1 w.p. 1/4,
    # so the 2.5th and 97.5th percentiles are 0 and 1.
    assert bootstrap_interval([0.0, 1.0]) == (0.5, 0.0, 1.0)


def test_bootstrap_interval_is_reproducible_and_within_the_data_range():
    x = [0.31, 0.44, 0.52, 0.29, 0.61]
    first, again = bootstrap_interval(x), bootstrap_interval(x)
    assert first == again
    mean, low, high = first
    assert min(x) <= low <= mean <= high <= max(x)
    assert bootstrap_interval(x, seed=1) != first  # the seed is really used
    assert RESAMPLES == 10_000


@pytest.mark.parametrize("values", [[], [1.0, float("nan")]])
def test_bootstrap_interval_refuses_empty_or_non_finite(values):
    with pytest.raises(ValueError, match="bootstrap_interval"):
        bootstrap_interval(values)


def test_separated_only_when_intervals_do_not_overlap():
    assert separated((1.0, 0.9, 1.1), (0.5, 0.4, 0.6)) == 1
    assert separated((0.5, 0.4, 0.6), (1.0, 0.9, 1.1)) == -1
    assert separated((1.0, 0.59, 1.1), (0.5, 0.4, 0.6)) == 0  # touching/overlapping: no difference
    assert separated(None, (0.5, 0.4, 0.6)) == 0


def _row(name, reward, reached=3):
    row = {"arm": name, "n": 3, "reuse": 4, "strategy": "drop", "lag": 1, "max_age_spec": "4"}
    for key, _, _ in agg_mod.METRICS:
        row[key], row[key + "_reached"] = (reward if key == "sample_reward_last" else None), 0
    row["sample_reward_last_reached"] = reached
    return row


def test_report_names_a_difference_only_when_intervals_separate():
    rows = [_row("A", (0.8, 0.75, 0.85)), _row("B", (0.5, 0.45, 0.55)), _row("C", (0.7, 0.5, 0.8))]
    line = next(x for x in differences(rows) if "sampled reward" in x)
    assert "A > B" in line and "C" not in line  # C overlaps both
    rows = [_row("A", (0.8, 0.6, 0.85)), _row("B", (0.5, 0.45, 0.65))]
    assert "no two arms' intervals separate" in next(x for x in differences(rows) if "sampled reward" in x)


def test_report_skips_pairs_that_lack_a_value_on_some_seed():
    rows = [_row("A", (0.8, 0.75, 0.85), reached=2), _row("B", (0.5, 0.45, 0.55))]
    line = next(x for x in differences(rows) if "sampled reward" in x)
    assert "A > B" not in line and "not compared" in line


@pytest.mark.parametrize(
    "text, seeds", [("0-4", [0, 1, 2, 3, 4]), ("0,3,7", [0, 3, 7]), ("0-2,9", [0, 1, 2, 9]), ("5", [5])]
)
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(
    "text, message",
    [
        ("0-x", "'0-x' is not a seed"),
        ("3-1", "'3-1' is not a range"),
        ("0,0", "lists a seed twice"),
        ("", "'' is not a seed"),
        ("-1", "'-1' is not a seed"),
    ],
)
def test_parse_seeds_refuses_bad_lists(text, message):
    with pytest.raises(ValueError, match=message):
        parse_seeds(text)
