"""A fixed seed gives byte-identical records (interleave mode); another seed does not."""

from _experiment_helpers import run_small


def _jsonl(result):
    with open(result.files["jsonl"], "rb") as f:
        return f.read()


def test_identical_seeds_give_identical_jsonl():
    first, second = run_small(ticks=30), run_small(ticks=30)
    assert _jsonl(first) == _jsonl(second)
    assert _jsonl(first) != _jsonl(run_small(ticks=30, seed=1))
