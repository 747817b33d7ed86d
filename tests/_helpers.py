"""Assertion helpers shared by the test modules."""


def rows(batch, n_fields=6):
    """Returns the deterministic columns of a batch as lists (the wall-clock stamps are left out)."""
    return batch.columns[:n_fields].tolist()


def assert_balanced(buf, quiescent=True):
    """Asserts both ledger invariants of docs/design.md ("The ledger") on one ledger snapshot.

    With ``quiescent`` (no other thread is calling the buffer) it also checks the snapshot against
    ``len(buf)`` and ``buf.in_flight``, which are separate reads another thread's call could fall between.
    """
    led = buf.ledger()
    assert led["sampled_total"] == led["retired"] + led["dropped_stale"] + led["evicted"] + led["buffer_left"], led
    assert led["dispatched"] == led["completed"] + led["failed"] + led["in_flight"], led
    if quiescent:
        assert led["buffer_left"] == len(buf)
        assert led["in_flight"] == buf.in_flight
    return led
