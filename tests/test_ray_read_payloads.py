"""Reading a taken batch's payloads (``pyfast_buffer/ray/_batch.read_payloads``): one get for them all, the
objects gone with their owner told apart from the rest, and a timeout over the whole read, on a real Ray."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")

from pyfast_buffer.ray._batch import read_payloads  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.usefixtures("ray_namespace")

NAMESPACE = "pyfast_buffer_read_payloads_tests"


@ray.remote(num_cpus=0)
class Holder:
    """Owns what it puts: its objects go when it is killed."""

    def hold(self, value: int) -> list:
        return [ray.put(np.full(1000, value))]


@ray.remote(num_cpus=0)
def slow(seconds: float) -> int:
    time.sleep(seconds)
    return 1


def test_values_in_order_with_none_where_no_payload_was_put():
    refs = [ray.put(np.full(10, 1)), None, ray.put(np.full(10, 3))]
    values, gone = read_payloads(refs, timeout=30)
    assert int(values[0][0]) == 1 and values[1] is None and int(values[2][0]) == 3
    assert not gone.any()


def test_objects_gone_with_their_owner_are_marked_and_the_others_read():
    holder = Holder.remote()
    (lost,) = ray.get(holder.hold.remote(7))
    assert int(ray.get(lost)[0]) == 7
    ray.kill(holder)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the owner's death reaches this process
        try:
            ray.get(lost, timeout=5)
        except ray.exceptions.ObjectLostError:
            break
        time.sleep(0.2)
    refs = [ray.put(np.full(10, 1)), lost, None, ray.put(np.full(10, 4))]
    values, gone = read_payloads(refs, timeout=30)
    assert gone.tolist() == [False, True, False, False]
    assert int(values[0][0]) == 1 and values[1] is None and values[2] is None and int(values[3][0]) == 4


def test_the_timeout_bounds_the_whole_read_and_says_how_many_were_not_readable():
    refs = [ray.put(1), slow.remote(60), slow.remote(60)]
    began = time.monotonic()
    with pytest.raises(ray.exceptions.GetTimeoutError, match=r"2 of 3 payloads were not readable within 0\.5 s"):
        read_payloads(refs, timeout=0.5)
    assert time.monotonic() - began < 30  # a bound on a hang, not a speed claim
    for ref in refs[1:]:
        ray.cancel(ref, force=True)
