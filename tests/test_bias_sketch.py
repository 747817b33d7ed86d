"""The bias monitor's sketches: buckets as the core computes them, quantiles and KS within the stated error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from pyfast_buffer import bias

LENGTH = 1  # the quantity index of response lengths
GENERATED, TRAINED = 0, 1


def _length_sketch(buf, fate, part=0):
    counts, n, _, *_ = buf._bias_now()
    return counts[part, fate * 2 + LENGTH], int(n[part, fate * 2 + LENGTH])


def test_python_buckets_match_the_cores(impl):
    rng = np.random.default_rng(1)
    lengths = np.concatenate([np.arange(0, 300), rng.integers(0, 2**32 - 1, size=2000), [2**41 - 1, 2**32 - 2]])
    lengths = lengths[lengths < 2**32 - 1]
    buf = impl(len(lengths), max_age=5)
    buf.dispatch([1], 0)
    buf.complete(np.arange(len(lengths)), np.ones(len(lengths), dtype=np.int64), lengths=lengths)
    counts, n = _length_sketch(buf, GENERATED)
    assert n == len(lengths)
    assert counts.tolist() == np.bincount(bias.bucket_of(lengths), minlength=bias.BUCKETS).tolist()


def test_bucket_edges_contain_their_values_and_span_at_most_a_sixteenth():
    low, width = bias.bucket_edges()
    values = np.unique(np.concatenate([np.arange(0, 5000), np.geomspace(5000, 2**40, 5000).astype(np.int64)]))
    b = bias.bucket_of(values)
    assert ((low[b] <= values) & (values < low[b] + width[b])).all()
    assert (width[32:] / low[32:] <= 1 / 16).all() and (width[:32] == 1).all()


@given(
    st.lists(st.floats(0, 14), min_size=1, max_size=400),
    st.sampled_from([0.1, 0.5, 0.9, 0.99]),
)
def test_a_quantile_is_within_the_stated_error(log_values, q):
    values = np.exp(np.asarray(log_values)).astype(np.int64)  # heavy-tailed, 1 .. 1.2e6
    counts = np.bincount(bias.bucket_of(values), minlength=bias.BUCKETS)
    exact = float(np.quantile(values, q, method="inverted_cdf"))
    got = bias.quantile(counts, q)
    assert abs(got - exact) <= max(exact * bias.QUANTILE_ERROR, 0.5)


@given(
    st.lists(st.floats(0, 12), min_size=1, max_size=300),
    st.lists(st.floats(0, 12), min_size=1, max_size=300),
)
def test_ks_from_sketches_is_a_lower_bound_within_the_largest_bucket_mass(a, b):
    x = np.exp(np.asarray(a)).astype(np.int64)
    y = np.exp(np.asarray(b)).astype(np.int64)
    ca = np.bincount(bias.bucket_of(x), minlength=bias.BUCKETS)
    cb = np.bincount(bias.bucket_of(y), minlength=bias.BUCKETS)
    with np.errstate(divide="ignore", invalid="ignore"):  # scipy's p-value of tiny samples; the statistic is exact
        exact = stats.ks_2samp(x, y, method="asymp").statistic
    got = bias.ks(ca, cb)
    assert got <= exact + 1e-12
    assert exact - got <= bias.ks_error_bound(ca, cb) + 1e-12


def test_ks_is_exact_for_values_below_32():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 32, 500), rng.integers(0, 20, 300)
    ca = np.bincount(bias.bucket_of(x), minlength=bias.BUCKETS)
    cb = np.bincount(bias.bucket_of(y), minlength=bias.BUCKETS)
    assert bias.ks(ca, cb) == pytest.approx(stats.ks_2samp(x, y, method="asymp").statistic)


def test_trained_vs_generated_length_ks_and_means_on_a_buffer(impl):
    """Long responses are completed late and dropped stale: the trained lengths are shorter, as measured."""
    rng = np.random.default_rng(7)
    buf = impl(4096, max_age=1)
    short, long_ = rng.integers(10, 200, 300), rng.integers(1000, 8000, 100)
    buf.dispatch(np.arange(400), 0)
    buf.complete(np.arange(300), np.arange(300), lengths=short)
    assert len(buf.take(4096, 1)) == 300
    buf.complete(np.arange(300, 400), np.arange(300, 400), lengths=long_)
    assert len(buf.take(4096, 9)) == 0  # the long ones arrive too late
    m = bias.summarize(buf._bias_now(), "buffer/")
    generated = np.concatenate([short, long_])
    assert m["buffer/bias/length/generated/mean"] == pytest.approx(generated.mean())
    assert m["buffer/bias/length/trained/mean"] == pytest.approx(short.mean())
    assert m["buffer/bias/length/lost/mean"] == pytest.approx(long_.mean())
    exact = stats.ks_2samp(short, generated, method="asymp").statistic
    counts = buf._bias_now()[0][0]
    bound = bias.ks_error_bound(counts[2 + LENGTH], counts[LENGTH])
    assert exact - bound - 1e-12 <= m["buffer/bias/length_ks"] <= exact + 1e-12
    assert m["buffer/bias/length/trained/p90"] == pytest.approx(
        np.quantile(short, 0.9, method="inverted_cdf"), rel=bias.QUANTILE_ERROR, abs=0.5
    )
    assert m["buffer/bias/latency/generated/n"] == 400 and m["buffer/bias/latency/trained/n"] == 300


def test_the_window_forgets_what_the_cumulative_sketch_keeps(impl):
    buf = impl(64, max_age=5)
    buf.dispatch([1], 0)
    buf.complete([1, 2], [1, 1], lengths=[5, 6])
    buf.take(8, 0)
    m = bias.summarize(buf._bias_now(), "")
    assert m["bias/window/length/trained/n"] == 2 and m["bias/length/trained/n"] == 2
    for _ in range(bias.WINDOW_PARTS * bias.WINDOW_TAKES):
        buf.take(8, 0)
    m = bias.summarize(buf._bias_now(), "")
    assert m["bias/window/length/trained/n"] == 0 and m["bias/length/trained/n"] == 2
    assert np.isnan(m["bias/window/length_ks"]) and m["bias/length_ks"] == 0.0


def test_the_monitor_is_absent_until_the_first_dispatch(impl):
    buf = impl(8)
    buf.put([1], 0)
    buf.take(1, 0)
    assert buf._bias_now() is None and not any("bias/" in k for k in buf.data_metrics())
