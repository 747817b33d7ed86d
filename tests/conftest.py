"""Shared fixtures: every behaviour test runs on the native buffer and on its pure-Python twin."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

import pyfast_buffer as pfb

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile("thorough", max_examples=2000, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

IMPLEMENTATIONS = {"native": pfb.StalenessBuffer, "reference": pfb.ReferenceBuffer}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def impl(request):
    """The buffer class under test: StalenessBuffer or ReferenceBuffer."""
    return IMPLEMENTATIONS[request.param]


@pytest.fixture(scope="session")
def ray_cluster():
    """A private two-node Ray cluster on loopback, started once per session for every Ray test module.

    Once a process has run an in-process local Ray (``ray.init()`` without an address, as the verl tests
    do), Ray 2.60 fails every actor it creates in
    another cluster ("all references to the actor were removed"); pytest_collection_modifyitems below runs
    them first. Each node has 16 logical CPUs (scheduling tokens, not cores: every buffer's index actor takes
    one) and its own custom resource (``node0``, ``node1``) to pin producers with.
    """
    pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")
    from pyfast_buffer.bench.ray_cluster import LocalCluster

    cluster = LocalCluster(nodes=2, cpus_per_node=16, object_store_bytes=384 * 2**20)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def ray_namespace(request, ray_cluster):
    """Connects this module to the session's cluster in its own namespace (the module's ``NAMESPACE``)."""
    import ray
    from _ray_helpers import kill_named_actors

    namespace = request.module.NAMESPACE
    # A node an earlier module lost and could not start again is started here: its failure stays with it.
    for i in ray_cluster.missing():
        ray_cluster.start_node(i)
    ray_cluster.connect(namespace=namespace)
    try:
        yield namespace
    finally:
        kill_named_actors(namespace)
        ray.shutdown()


@pytest.fixture
def buffers_ended(ray_namespace):
    """Buffers are detached by default: each test ends the ones it made (index and payload owners)."""
    from _ray_helpers import kill_named_actors

    yield
    kill_named_actors(ray_namespace)


@pytest.fixture(scope="session")
def verl_cpu():
    """verl 0.9.1 on CPU: a local Ray with TransferQueue, started once for the verl trainer test modules."""
    pytest.importorskip("verl", minversion="0.9.1", reason="verl 0.9.1 is not installed (bash .ci/verl-stage.sh)")
    from _verl_cpu_trainer import verl_on_cpu

    with verl_on_cpu():
        yield


def pytest_collection_modifyitems(config, items):
    """Runs the Ray cluster test files first: Ray 2.60 cannot create actors in the session's two-node cluster
    once this process has run an in-process local Ray (the verl tests start one), but the other order works."""
    cluster_first = [item for item in items if "ray_namespace" in getattr(item, "fixturenames", ())]
    if cluster_first:
        rest = [item for item in items if "ray_namespace" not in getattr(item, "fixturenames", ())]
        items[:] = cluster_first + rest
