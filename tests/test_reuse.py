"""max_uses: an entry is taken up to max_uses times, keeps its place, and still goes stale."""

from _helpers import assert_balanced


def test_entries_are_reused_until_max_uses_then_retire(impl):
    buf = impl(8, max_age=10, max_uses=3)
    buf.put([1, 2], 0)
    uses = [buf.take(2, 0).uses.tolist() for _ in range(4)]
    assert uses == [[1, 1], [2, 2], [3, 3], []]
    led = assert_balanced(buf)
    assert led["taken"] == 6 and led["retired"] == 2


def test_reused_entries_keep_their_place_ahead_of_newer_ones(impl):
    buf = impl(8, max_age=10, max_uses=2)
    buf.put([1, 2], 0)
    assert buf.take(1, 0).traj_ids.tolist() == [1]
    buf.put([3], 0)
    batch = buf.take(3, 0)
    assert batch.traj_ids.tolist() == [1, 2, 3]
    assert batch.uses.tolist() == [2, 1, 1]
    assert buf.take(3, 0).traj_ids.tolist() == [2, 3]


def test_staleness_applies_to_reused_entries(impl):
    buf = impl(8, max_age=1, max_uses=5)
    buf.put([1], 0)
    assert buf.take(1, 1).uses.tolist() == [1]
    batch = buf.take(1, 2)
    assert len(batch) == 0 and batch.metrics["buffer/dropped_stale"] == 1
    led = assert_balanced(buf)
    assert led["taken"] == 1 and led["retired"] == 0 and led["dropped_stale"] == 1
