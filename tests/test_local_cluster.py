"""The test and bench cluster's core pinning (``LocalCluster(cores=...)``): a node's processes keep to its cores.

The two-node bench rows rely on it: a second node on this machine adds cores only if each node keeps to its
own. One node is started (about 10 s), pinned to one core, and every process it left running is checked.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed: pip install '.[ray]'")
psutil = pytest.importorskip("psutil", reason="psutil comes with the ray extra: pip install '.[ray]'")

from pyfast_buffer.bench.ray_cluster import LocalCluster  # noqa: E402


@pytest.mark.parametrize("cores", [[[0]], [[0], []], [[0], [1], [0]]], ids=["too-few", "empty", "too-many"])
def test_cores_must_name_cores_for_each_node(cores):
    before = set(os.listdir("/tmp"))
    with pytest.raises(ValueError, match="non-empty list of CPU cores for each of the 2 nodes"):
        LocalCluster(nodes=2, cores=cores)
    assert {n for n in os.listdir("/tmp") if n.startswith("pfbray-")} <= before  # nothing started or made


def test_a_pinned_node_keeps_every_process_on_its_cores():
    core = sorted(os.sched_getaffinity(0))[-1]
    cluster = LocalCluster(nodes=1, cpus_per_node=1, object_store_bytes=80 * 2**20, cores=[[core]])
    try:
        procs = cluster.node_processes(0)
        assert procs, "the node left no process running"
        for proc in procs:
            try:
                assert proc.cpu_affinity() == [core], proc.cmdline()
            except psutil.NoSuchProcess:
                continue
    finally:
        cluster.stop()


def test_ports_picked_at_once_are_distinct_and_avoid_the_ones_named():
    from pyfast_buffer.bench import ray_cluster

    for _ in range(200):
        avoid = ray_cluster._free_ports(2)
        ports = ray_cluster._free_ports(7, avoid=avoid)
        assert len(set(ports)) == 7 and not set(ports) & set(avoid)


def test_a_node_whose_start_meets_a_port_collision_starts_again_on_other_ports(monkeypatch):
    """What CI met once: two of a node's components were handed one port (each picked free on its own), and
    ``ray start`` refused. The first pick here repeats one port on purpose; the node must still come up."""
    from pyfast_buffer.bench import ray_cluster

    picks = []
    real = ray_cluster._free_ports

    def first_pick_collides(count, avoid=()):
        ports = real(count, avoid)
        if count > 1:  # a node's ports (not the head's GCS port, picked first)
            if not picks:
                ports[4] = ports[2]  # the runtime-env agent on the dashboard agent's port, as in that CI run
            picks.append(ports)
        return ports

    monkeypatch.setattr(ray_cluster, "_free_ports", first_pick_collides)
    cluster = LocalCluster(nodes=1, cpus_per_node=1, object_store_bytes=80 * 2**20)
    try:
        assert len(picks) == 2 and len(set(picks[1])) == len(picks[1])
        assert cluster.node_processes(0), "the node left no process running"
        # The refused attempt left nothing behind: every process of the cluster belongs to the node.
        assert {p.pid for p in cluster._processes()} <= {p.pid for p in cluster.node_processes(0)}
        assert cluster.missing() == []
        cluster.kill_node(0)
        assert cluster.missing() == [0] and not cluster._processes()  # what the Ray test modules start again
    finally:
        cluster.stop()
