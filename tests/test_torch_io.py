"""Inputs accept torch tensors, numpy arrays and sequences; outputs are torch int64, pinned with CUDA."""

import numpy as np
import pytest
import torch

import pyfast_buffer as pfb

INPUTS = {
    "list": lambda ids: list(ids),
    "tuple": lambda ids: tuple(ids),
    "numpy int64": lambda ids: np.array(ids, dtype=np.int64),
    "numpy int32": lambda ids: np.array(ids, dtype=np.int32),
    "numpy uint16": lambda ids: np.array(ids, dtype=np.uint16),
    "numpy strided": lambda ids: np.array([v for i in ids for v in (i, -1)], dtype=np.int64)[::2],
    "torch int64": lambda ids: torch.tensor(ids),
    "torch int32": lambda ids: torch.tensor(ids, dtype=torch.int32),
    "torch non-contiguous": lambda ids: torch.tensor([[i, -1] for i in ids])[:, 0],
}


@pytest.mark.parametrize("kind", sorted(INPUTS))
def test_every_input_kind_gives_the_same_batch(impl, kind):
    convert = INPUTS[kind]
    buf = impl(8, max_age=9)
    buf.dispatch(convert([3, 4]), torch.tensor(1))
    buf.complete(convert([10, 11, 12]), convert([3, 3, 4]))
    buf.put(convert([13, 14]), np.int64(2), group_ids=convert([3, 4]))
    batch = buf.take(np.int32(8), current_step=torch.tensor(2))
    assert batch.traj_ids.tolist() == [10, 11, 12, 13, 14]
    assert batch.group_ids.tolist() == [3, 3, 4, 3, 4]


def test_range_and_empty_inputs(impl):
    buf = impl(8)
    buf.put(range(3), 0)
    buf.put(np.array([], dtype=np.int64), 0)
    assert buf.take(8, 0).traj_ids.tolist() == [0, 1, 2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (GPU checks live in benchmarks/gpu_check.py)")
def test_cuda_input_tensor_and_pinned_outputs():
    buf = pfb.StalenessBuffer(8)
    buf.put(torch.tensor([1, 2], device="cuda"), 0)
    batch = buf.take(2, 0)
    assert batch.columns.is_pinned() and all(c.is_pinned() for c in buf._columns)
    assert batch.to("cuda", non_blocking=True).traj_ids.tolist() == [1, 2]


def test_without_cuda_nothing_is_pinned():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    buf = pfb.StalenessBuffer(8)
    buf.put([1], 0)
    assert not buf.pin_memory and not buf.take(1, 0).columns.is_pinned()
    assert "pinned=False" in repr(buf)
    with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
        pfb.StalenessBuffer(8, pin_memory=True)


def test_repr_comes_from_the_core():
    buf = pfb.StalenessBuffer(8, max_age=2, strategy="wait")
    buf.put([1], 0)
    assert repr(buf).startswith("StalenessBuffer(capacity=8, max_age=2, strategy='wait'")
    assert "ready=1" in repr(buf)


def test_the_core_borrows_caller_columns_without_copying():
    """The pinned path: the wrapper hands torch-allocated columns to the core, which must write into them."""
    from pyfast_buffer import _core

    cols = [torch.zeros(8, dtype=torch.int64) for _ in range(7)] + [torch.zeros(8, dtype=torch.int32) for _ in range(2)]
    ring = _core.Ring(8, 3, "drop", 1, "evict_oldest", 0, tuple(c.numpy() for c in cols))
    assert ring.borrows_columns
    ring.put(np.array([41, 42], dtype=np.int64), None, np.array([5], dtype=np.int64), None)
    assert cols[0][:2].tolist() == [41, 42] and cols[2][:2].tolist() == [5, 5]  # traj_id, sample_step
    assert cols[8][:2].tolist() == [1, 1]  # group_len
    with pytest.raises(ValueError, match="contiguous int64 arrays"):
        _core.Ring(8, 3, "drop", 1, "evict_oldest", 0, tuple([np.zeros(8, np.int32)] + [c.numpy() for c in cols[1:]]))


def test_torch_steps_lengths_and_sources_are_read_as_numpy_would_be(impl):
    # Every id-like argument takes a torch tensor (a view of its memory when it is CPU int64): the same buffer
    # as numpy input, and the tensor changed after the call changes nothing (the buffer copied what it read).
    results = []
    for convert in (lambda v: np.array(v, dtype=np.int64), lambda v: torch.tensor(v)):
        buf = impl(16, max_age=9)
        prompts = convert([3, 4])
        buf.dispatch(prompts, 1, source=convert([1, 2]))
        trajs = convert([10, 11])
        buf.complete(trajs, prompts, finish_step=convert([2, 3]), lengths=convert([100, 200]))
        trajs[0] = 99
        buf.put(convert([12]), convert([2]))
        batch = buf.take(8, 3)
        results.append((batch.traj_ids.tolist(), batch.finish_step.tolist(), batch.source.tolist(), buf.ledger()))
    assert results[0] == results[1] and results[0][0] == [10, 11, 12]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: torch.arange(10, 16), id="contiguous int64"),
        pytest.param(lambda: torch.arange(7, 16)[3:], id="offset into its storage"),
        pytest.param(lambda: torch.arange(10, 22)[::2], id="strided"),
        pytest.param(lambda: torch.arange(10, 16, dtype=torch.int32), id="int32"),
        pytest.param(lambda: torch.arange(10, 16).view(2, 3)[0], id="row of a 2-d tensor"),
        pytest.param(lambda: torch.arange(10, 16).view(2, 3).t().contiguous().flatten(), id="transposed then copied"),
        pytest.param(lambda: torch.empty(0, dtype=torch.int64), id="empty"),
        pytest.param(lambda: torch.nn.Parameter(torch.arange(10, 16), requires_grad=False), id="subclass"),
    ],
)
def test_put_reads_any_id_tensor_as_its_numpy_copy_would_be(impl, make):
    """put's one-stamp call reads a plain CPU int64 tensor through its data pointer and declines everything else
    to the general route: either way the buffer holds what numpy input of the same values gives, and rewriting
    the tensor after the call changes nothing."""
    held = []
    for convert in (lambda t: t.numpy().copy(), lambda t: t):
        ids = convert(make())
        buf = impl(16, max_age=4)
        buf.put(ids, 2)
        if len(ids):
            ids[0] = 99
        held.append((buf.take(16, 2).traj_ids.tolist(), buf.ledger()))
    assert held[0] == held[1]


def test_put_refuses_a_two_dimensional_tensor_as_it_refuses_the_array(impl):
    for ids in (np.zeros((2, 2), dtype=np.int64), torch.zeros(2, 2, dtype=torch.int64)):
        buf = impl(8, max_age=2)
        with pytest.raises(ValueError, match="traj_ids"):
            buf.put(ids, 0)
        assert len(buf) == 0
