"""take's metrics dict (stable names, age stats, histogram) and the one-line log record."""

import logging
import re

import pytest
import torch
from _helpers import assert_balanced

import pyfast_buffer as pfb
from pyfast_buffer.batch import BLOCKED_BY, DEFAULT_METRICS_PREFIX, metric_key, set_metrics_prefix

NAMES = {
    "taken",
    "dropped_stale",
    "retired",
    "evicted",
    "buffer_left",
    "sampled_total",
    "in_flight",
    "age_mean",
    "age_max",
    "blocked_by",
    "trained_over_age",
    "span_mean",
    "span_max",
    "admitted",
    "admission_refused",
    "admission_waits",
    "retries",
    "prompts_retried",
    "regenerations",
    "protected",
    "prompts_starved",
    "attempts_forgotten",
    "protected_admitted",
    "admitted_ahead",
    "retired_early",
} | {f"age_hist/{b}" for b in pfb.AGE_BUCKETS}
STABLE_KEYS = {"buffer/" + n for n in NAMES}


def test_metrics_have_stable_names_and_exact_age_statistics(impl):
    buf = impl(64, max_age=100)
    for step in (0, 1, 3, 5, 10, 40):
        buf.put([step], step)
    buf.dispatch([1], 40)
    m = {k.removeprefix("buffer/"): v for k, v in buf.take(6, current_step=70).metrics.items()}
    assert {"buffer/" + k for k in m} == STABLE_KEYS
    ages = [70, 69, 67, 65, 60, 30]
    assert m["age_mean"] == sum(ages) / 6 and m["age_max"] == 70
    assert m["age_hist/64+"] == 4 and m["age_hist/32-63"] == 1 and m["age_hist/16-31"] == 1
    assert sum(m[f"age_hist/{b}"] for b in pfb.AGE_BUCKETS) == m["taken"] == 6
    assert (m["sampled_total"], m["in_flight"], m["buffer_left"]) == (6, 1, 0)


def test_age_buckets_are_powers_of_two(impl):
    buf = impl(64, max_age=100)
    ages = [0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64]
    for age in ages:
        buf.put([age], 64 - age)
    m = {k.removeprefix("buffer/"): v for k, v in buf.take(len(ages), 64).metrics.items()}
    assert [m[f"age_hist/{b}"] for b in pfb.AGE_BUCKETS] == [1, 1, 2, 2, 2, 2, 2, 1]


def test_empty_take_metrics(impl):
    batch = impl(4).take(2, 0)
    m = batch.metrics
    assert m["buffer/taken"] == 0 and m["buffer/age_mean"] == 0.0
    assert m["buffer/blocked_by"] == BLOCKED_BY.index("too_few_ready") and batch.blocked_by == "too_few_ready"


def test_every_metric_is_a_number_a_scalar_logger_accepts(impl):
    buf = impl(8, max_age=1, strategy="wait")
    buf.put([1, 2], 0)
    buf.dispatch([9], 0)
    batch = buf.take(4, 1)
    assert batch.blocked_by == "in_flight_at_max_age"
    for key, value in batch.metrics.items():  # e.g. writer.add_scalar(key, value) / wandb.log(metrics)
        assert key.startswith(DEFAULT_METRICS_PREFIX) and isinstance(value, (int, float)), (key, value)
    assert BLOCKED_BY[int(batch.metrics["buffer/blocked_by"])] == batch.blocked_by


def test_metrics_prefix_is_chosen_by_the_user(impl):
    buf = impl(8)
    buf.put([1], 0)
    try:
        set_metrics_prefix("train/pool/")
        batch = buf.take(1, 0)
        assert batch.metrics["train/pool/taken"] == 1 and metric_key("taken") == "train/pool/taken"
        assert all(k.startswith("train/pool/") for k in batch.metrics)
        set_metrics_prefix("")
        assert "taken" in buf.take(1, 0).metrics
    finally:
        set_metrics_prefix(DEFAULT_METRICS_PREFIX)
    with pytest.raises(TypeError, match="prefix"):
        set_metrics_prefix(None)  # type: ignore[arg-type]


def test_log_records_reconcile_with_grep_and_awk_arithmetic(impl, caplog):
    caplog.set_level(logging.INFO, logger="pyfast_buffer")
    buf = impl(6, max_age=2)
    step = 0
    for step in range(12):
        buf.put([10 * step + i for i in range(3)], max(0, step - (step % 4)))
        if step % 3 == 2:
            buf.take(4, current_step=step)
    buf.evict_stale(step + 1)
    buf.take(2, current_step=step + 1)
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "pyfast_buffer")

    def total(field):
        return sum(int(v) for v in re.findall(rf"\b{field}=(\d+)", text))

    last = [line for line in text.splitlines() if "sampled_total=" in line][-1]
    last_left = int(re.search(r"buffer_left=(\d+)", last).group(1))
    last_sampled = int(re.search(r"sampled_total=(\d+)", last).group(1))
    led = assert_balanced(buf)
    assert last_sampled == led["sampled_total"] == 36
    assert total("dropped_stale") == led["dropped_stale"] > 0
    assert total("evicted") == led["evicted"] > 0
    assert total("taken") == led["taken"] == total("retired")
    assert last_sampled == total("retired") + total("dropped_stale") + total("evicted") + last_left


def test_log_line_format(impl, caplog):
    caplog.set_level(logging.INFO, logger="pyfast_buffer")
    buf = impl(4)
    buf.put([1], 0)
    buf.take(1, 0)
    assert caplog.records[-1].getMessage() == (
        "dropped_stale=0 taken=1 buffer_left=0 sampled_total=1 retired=1 evicted=0 max_age=7 expired=0 "
        "trained_over_age=0 admitted=0 admission_refused=0 admission_waits=0"
        " retried=0 starved=0 regenerations=0 protected_admitted=0 admitted_ahead=0 retired_early=0"
    )
    assert caplog.records[-1].getMessage().startswith(pfb.LOG_FORMAT.split(" retired")[0] % (0, 1, 0, 1))


def test_batch_fields_are_typed_tensors_over_the_same_memory():
    buf = pfb.StalenessBuffer(16, max_age=3)
    buf.put([5, 6, 7], 2)
    batch = buf.take(3, 2)
    ids = batch.traj_ids  # before batch.columns exists: a tensor over the numpy row
    assert ids.tolist() == [5, 6, 7] and ids.dtype == torch.int64
    batch.columns[0, 0] = 50  # the block and the row share memory
    assert ids.tolist() == [50, 6, 7] and batch.traj_ids.tolist() == [50, 6, 7]
    assert [getattr(batch, f).tolist() for f in pfb.FIELDS] == batch.columns.tolist()
    assert len(batch) == 3 and batch.age.tolist() == [0, 0, 0]


def test_blocked_by_and_repr_survive_a_prefix_change(impl):
    batch = impl(4).take(2, 0)
    batch.metrics  # built under the default prefix
    try:
        set_metrics_prefix("other/")
        assert batch.blocked_by == "too_few_ready"
        assert "blocked_by='too_few_ready'" in repr(batch)
    finally:
        set_metrics_prefix(DEFAULT_METRICS_PREFIX)
