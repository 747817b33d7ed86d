"""buf.max_age may change between calls: validated, thread-safe, counted, applied by the next take/evict."""

import logging
import threading

import pytest
from _helpers import assert_balanced


@pytest.mark.parametrize(
    "bad, error", [("3", TypeError), (1.5, TypeError), (True, TypeError), (None, TypeError), (-1, ValueError)]
)
def test_bad_max_age_is_refused_and_changes_nothing(impl, bad, error):
    buf = impl(8, max_age=3)
    buf.put([1, 2], 0)
    before = buf.ledger()
    with pytest.raises(error, match="max_age"):
        buf.max_age = bad
    assert buf.max_age == 3 and buf.config.max_age == 3 and buf.ledger() == before


def test_lowering_max_age_drops_at_the_next_take(impl):
    buf = impl(16, max_age=5)
    for step in range(5):
        buf.put([step], step)
    buf.max_age = 1
    assert buf.max_age == 1 and buf.config.max_age == 1
    batch = buf.take(8, current_step=4)
    assert batch.traj_ids.tolist() == [3, 4]
    assert batch.metrics["buffer/dropped_stale"] == 3
    led = assert_balanced(buf)
    assert led["max_age_changes"] == 1 and led["dropped_stale"] == 3


def test_raising_max_age_keeps_dropped_entries_dropped(impl):
    buf = impl(16, max_age=0)
    buf.put([1], 0)
    buf.put([2], 1)
    assert buf.evict_stale(1) == 1  # entry 1 (age 1) dropped under max_age 0
    buf.max_age = 10
    assert buf.take(8, current_step=1).traj_ids.tolist() == [2]
    led = assert_balanced(buf)
    assert led["dropped_stale"] == 1 and led["max_age_changes"] == 1


def test_evict_stale_applies_the_new_cutoff_to_every_ready_entry(impl):
    buf = impl(16, max_age=8)
    buf.put([1, 2, 3], [5, 0, 3])  # unsorted stamps: the compaction path
    buf.max_age = 2
    assert buf.evict_stale(5) == 1
    assert buf.take(8, current_step=5).traj_ids.tolist() == [1, 3]


def test_setting_the_same_value_is_not_a_change(impl):
    buf = impl(4, max_age=3)
    buf.max_age = 3
    assert buf.ledger()["max_age_changes"] == 0
    buf.max_age = 4
    buf.max_age = 3
    assert buf.ledger()["max_age_changes"] == 2


def test_log_record_carries_the_max_age_in_force(impl, caplog):
    caplog.set_level(logging.INFO, logger="pyfast_buffer")
    buf = impl(4, max_age=3)
    buf.put([1], 0)
    buf.max_age = 6
    buf.take(1, 0)
    assert " max_age=6 " in caplog.records[-1].getMessage()


def test_under_wait_a_lowered_bound_blocks_until_the_prompt_finishes(impl):
    buf = impl(16, max_age=5, strategy="wait")
    buf.dispatch([50], step=0)
    buf.put([1], 2)
    buf.max_age = 2  # prompt 50 now has age 2 == max_age at step 2
    blocked = buf.take(1, current_step=2)
    assert len(blocked) == 0 and blocked.blocked_by == "in_flight_at_max_age"
    buf.fail([50])
    assert buf.take(1, current_step=2).traj_ids.tolist() == [1]


def test_raising_max_age_wakes_a_blocked_take(impl):
    buf = impl(16, max_age=1, strategy="wait")
    buf.dispatch([50], step=0)
    buf.put([1], 1)
    result = {}

    def consumer():
        result["batch"] = buf.take(1, current_step=1, timeout=30)

    thread = threading.Thread(target=consumer)
    thread.start()
    buf.max_age = 4
    thread.join(30)
    assert not thread.is_alive() and result["batch"].traj_ids.tolist() == [1]


def test_state_dict_records_the_max_age_and_load_keeps_the_loaders(impl):
    buf = impl(8, max_age=3)
    buf.put([1], 0)
    buf.max_age = 5
    sd = buf.state_dict()
    assert sd["config"]["max_age"] == 5 and sd["ledger"]["max_age_changes"] == 1
    other = impl(8, max_age=2)
    other.load_state_dict(sd)
    assert other.max_age == 2  # the configuration is the loader's; apply sd["config"]["max_age"] to restore it
    assert other.ledger()["max_age_changes"] == 1
    other.max_age = sd["config"]["max_age"]
    assert other.max_age == 5


def test_state_dict_without_the_counter_still_loads(impl):
    buf = impl(8)
    buf.put([1], 0)
    sd = buf.state_dict()
    del sd["ledger"]["max_age_changes"]
    other = impl(8)
    other.load_state_dict(sd)
    assert other.ledger()["max_age_changes"] == 0 and len(other) == 1


def test_concurrent_setters_and_takers_keep_the_ledger_balanced(impl):
    buf = impl(256, max_age=4)
    stop = threading.Event()
    errors = []

    def setter():
        k = 0
        while not stop.is_set():
            buf.max_age = k % 6
            k += 1

    def worker(offset):
        try:
            for i in range(300):
                buf.put([offset + i], i % 6)  # ages 5..0 at step 5: the bound in force decides each drop
                buf.take(2, current_step=5)
                assert_balanced(buf, quiescent=False)  # the other worker runs: one snapshot's identities
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=setter)]
    threads += [threading.Thread(target=worker, args=(k * 10_000,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    assert not errors
    assert buf.max_age == buf.config.max_age
    assert_balanced(buf)


def test_a_take_without_the_bound_drops_nothing_and_counts_what_it_trained_past_it(impl):
    buf = impl(16, max_age=1, strategy="drop", track_released=True, source_max_age={2: 0})
    buf.put([1, 2], 0)
    buf.put([3], 4, source=2)  # past its source's own bound (0) at step 5 too
    buf.put([5], 5)
    batch = buf.take(8, 5, bounded=False)
    assert sorted(batch.traj_ids.tolist()) == [1, 2, 3, 5]
    assert batch.metrics["buffer/dropped_stale"] == 0
    led = buf.ledger()
    assert led["trained_over_age"] == 2 and led["dropped_stale"] == 0 and led["max_age_changes"] == 0
    assert buf.max_age == 1 and buf.config.max_age == 1
    assert buf.released().of("retired").tolist() == [1, 2, 3, 5]
    buf.put([4], 3)  # the next take is bounded again: age 2 > 1 is dropped
    assert len(buf.take(8, 5)) == 0 and buf.ledger()["dropped_stale"] == 1


def test_a_take_without_the_bound_is_not_held_by_waits_in_flight_gate(impl):
    buf = impl(16, max_age=1, strategy="wait")
    buf.dispatch([7], 0)
    buf.put([1], 0)
    assert buf.take(1, 1).blocked_by == "in_flight_at_max_age"
    assert buf.take(1, 1, bounded=False).traj_ids.tolist() == [1]


def test_a_take_without_the_bound_is_refused_under_pace_and_bad_values_are_refused(impl):
    paced = impl(16, max_age=1, strategy="pace", prompts_per_step=1)
    with pytest.raises(ValueError, match="bounded=False is refused under pace"):
        paced.take(1, 0, bounded=False)
    buf = impl(16, max_age=1)
    buf.put([1], 0)
    for bad in (0, 1, None, "no"):
        with pytest.raises(TypeError, match=r"must be True .* or False"):
            buf.take(1, 0, bounded=bad)
    assert len(buf) == 1 and buf.ledger()["taken"] == 0
