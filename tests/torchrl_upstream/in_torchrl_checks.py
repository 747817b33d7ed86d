"""TorchRL's own replay-buffer tests that apply to any sampler, re-run with ours (by run_torchrl_suite.py, from a
TorchRL checkout's ``test/rb``; not collected by the project's pytest run).

- ``TestComposableBuffers`` (test_composable.py): every buffer type, storage, writer, data type and size, with
  ``StalenessSampler(version_key=None)`` in place of its sampler list: data without a version column is stamped
  with ``consumer_version`` at write (the suite writes none).
- ``TestStalenessAwareSampler`` (test_samplers.py) with ``StalenessAwareSampler`` replaced by ours (its
  ``max_staleness`` passed as ``max_age``, -1 as no bound, and ``max_uses`` unbounded as that sampler reuses every
  entry), except two tests that assert that sampler's own
  choices rather than a contract: ``test_freshness_weighting`` (a draw weighted toward fresh data: ours takes the
  stalest fresh entries first, so they are used before they age out) and ``test_state_dict_roundtrip`` (the
  key ``max_staleness``: ours is ``max_age``).
- ``TestRBMultidim.test_rb_multidim`` (test_ensemble.py), 1-d and 2-d storages, with ``info_key=None``: the test
  asserts every sampled column equals its data, so an extra ``staleness`` column would fail it.
"""

from __future__ import annotations

import functools

import pytest
import test_composable as composable
import test_ensemble as ensemble
import test_samplers as samplers
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer, TensorDictReplayBuffer

from pyfast_buffer.integrations.torchrl import StalenessSampler

NO_BOUND = 2**40
MANY_USES = 2**31 - 1


def _reparametrized(cls: type, name: str, sampler: object) -> type:
    """``cls`` with its ``sampler`` parametrization replaced (a copy, not a subclass: pytest merges marks)."""
    marks = [m for m in cls.pytestmark if not (m.name == "parametrize" and m.args[0] == "sampler")]
    namespace = {k: v for k, v in vars(cls).items() if k not in ("pytestmark", "__dict__", "__weakref__")}
    namespace["pytestmark"] = [*marks, pytest.mark.parametrize("sampler", [sampler])]
    return type(name, (), namespace)


TestComposableOurs = _reparametrized(
    composable.TestComposableBuffers, "TestComposableOurs", functools.partial(StalenessSampler, version_key=None)
)


def _as_staleness_aware(max_staleness: int = -1, staleness_weight_fn=None, version_key="policy_version"):
    del staleness_weight_fn  # ours takes the stalest fresh entries first; there is no weight
    bound = NO_BOUND if max_staleness < 0 else max_staleness
    # max_uses without a bound: StalenessAwareSampler samples every entry as often as asked.
    return StalenessSampler(max_age=bound, version_key=version_key, max_uses=MANY_USES)


_staleness_tests = {
    k: v
    for k, v in vars(samplers.TestStalenessAwareSampler).items()
    if k not in ("__dict__", "__weakref__", "test_freshness_weighting", "test_state_dict_roundtrip")
}
TestStalenessContractOurs = type("TestStalenessContractOurs", (), _staleness_tests)


@pytest.fixture(autouse=True)
def _ours_as_staleness_aware(monkeypatch):
    monkeypatch.setattr(samplers, "StalenessAwareSampler", _as_staleness_aware)


@pytest.mark.parametrize("storage_cls", [LazyMemmapStorage, LazyTensorStorage])
@pytest.mark.parametrize("datadim", [1, 2])
@pytest.mark.parametrize(
    "datatype,rbtype",
    [
        ("pytree", ReplayBuffer),
        ("tensordict", ReplayBuffer),
        ("tensordict", TensorDictReplayBuffer),
        ("tensorclass", ReplayBuffer),
    ],  # the pairs of the upstream test's _rbtype
)
def test_rb_multidim_ours(datatype, datadim, rbtype, storage_cls):
    sampler = functools.partial(StalenessSampler, version_key=None, info_key=None)
    ensemble.TestRBMultidim().test_rb_multidim(datatype, datadim, rbtype, storage_cls, sampler)
