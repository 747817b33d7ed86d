"""Private Ray clusters for ``pyfast-buffer bench --cases ray`` and the project's Ray tests.

``init_local_cluster``: one in-process local cluster. ``LocalCluster``: one or two nodes on this machine
(loopback only).

Each node is a ``ray start`` of its own (a head, then a second node joining it) with its own custom
resource (``node0``, ``node1``) so that producers can be pinned to a node, a temporary directory of its
own and ports picked free at start. ``stop()`` ends exactly the processes these nodes started (found by
their temporary directory, and their children), never other Ray clusters on the machine (``ray stop``
would end them all).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Set

LOOPBACK = "127.0.0.1"
#: How many times a node's ``ray start`` is tried when it fails on a port (one picked free, then taken).
START_ATTEMPTS = 3
#: Environment of the node processes: no usage report, no token auth, and health checks patient enough for
#: a machine whose cores are shared with other work: a live node is declared dead only after 24 checks in a
#: row each got no answer within 30 s, a node whose raylet is gone (checks refused at once) after ~24 s.
CLUSTER_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "30000",
    "RAY_health_check_failure_threshold": "24",
    # Nodes of a multi-node cluster (the launcher below keeps them on loopback), even when this process was
    # told it is a single machine (a driver of such a cluster sets this to 0 for itself and its children).
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
}


#: Tells Ray (read when it is imported) not to replace loopback addresses: what a driver of this cluster needs.
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: ``ray start``, except that 127.0.0.1 stays 127.0.0.1: Ray replaces a loopback --node-ip-address and
#: --address with the machine's network address (to be reachable from other machines), which this
#: single-machine cluster must not use.
_LOOPBACK_RAY_START = (
    "import sys, ray._private.services as s\n"
    "s.resolve_ip_for_localhost = lambda host: host\n"
    "from ray.scripts.scripts import main\n"
    "sys.argv[0] = 'ray'\n"
    "main()\n"
)


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(count: int, avoid: Sequence[int] = ()) -> List[int]:
    """``count`` distinct ports free on loopback now, none of them in ``avoid``.

    The sockets stay bound until all are picked: a port closed and asked for again may be handed out again
    (two components of one node given the same port make ``ray start`` refuse to start).
    """
    held: List[socket.socket] = []
    ports: List[int] = []
    try:
        while len(ports) < count:
            s = socket.socket()
            held.append(s)
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
            if port not in avoid:
                ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def init_local_cluster(**kwargs: Any) -> None:
    """Starts a local cluster of its own (``ray.init(address="local", ...)``) from a neutral directory.

    Ray puts the driver's working directory first on every worker's ``sys.path``. Run from a source
    checkout, that directory holds the uncompiled ``pyfast_buffer`` package, which would shadow the
    installed one in every worker; starting Ray from the temporary directory keeps workers on the install.
    """
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # a single-machine cluster: its nodes listen on loopback only
    # Workers keep the driver's directory as their own working directory, so it must outlive the cluster:
    # the system's temporary directory, not one made (and removed) here.
    here = os.getcwd()
    os.chdir(tempfile.gettempdir())
    try:
        ray.init(address="local", **kwargs)
    finally:
        os.chdir(here)


class LocalCluster:
    """``nodes`` Ray nodes on loopback; ``connect()`` joins this driver; ``stop()`` ends every process of theirs."""

    def __init__(
        self,
        nodes: int = 2,
        cpus_per_node: int = 4,
        object_store_bytes: int = 256 * 2**20,
        cores: Optional[Sequence[Sequence[int]]] = None,
    ) -> None:
        """``cores[i]``: the CPU cores node ``i``'s processes may run on (``os.sched_setaffinity``, inherited by
        its raylet, workers and actors), so that two nodes on one machine do not share cores: a second node
        then brings cores of its own, as a second machine would. None: every node may use every core."""
        self.cores = [sorted(c) for c in cores] if cores is not None else None
        if self.cores is not None and (len(self.cores) != nodes or not all(self.cores)):
            raise ValueError(f"cores must name a non-empty list of CPU cores for each of the {nodes} nodes")
        self.temp_dir = tempfile.mkdtemp(prefix="pfbray-", dir="/tmp")  # short: Ray's socket paths are limited
        self.port = _free_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.nodes = nodes
        self._cpus_per_node = cpus_per_node
        self._object_store_bytes = object_store_bytes
        #: Node index -> pids of the processes its ``ray start`` left running (raylet, log monitor, ...); the
        #: node's workers and agents are their children.
        self._node_roots: Dict[int, List[int]] = {}
        try:
            for i in range(nodes):
                self.start_node(i)
        except BaseException:
            self.stop()
            raise

    def start_node(self, i: int) -> None:
        """Starts node ``i`` (the head for 0; else joining the head) with its custom resource ``node{i}``.

        Also how a node killed with ``kill_node(i)`` is replaced: the new node has a new node id.
        """
        common = [
            "--node-ip-address",
            LOOPBACK,
            "--num-cpus",
            str(self._cpus_per_node),
            "--object-store-memory",
            str(self._object_store_bytes),
            "--disable-usage-stats",
        ]
        head = ["--head", "--port", str(self.port), "--include-dashboard", "false"]
        where = head if i == 0 else ["--address", self.address]
        env = {**os.environ, **CLUSTER_ENV}
        for attempt in range(1, START_ATTEMPTS + 1):
            before = {p.pid for p in self._processes()}
            out = self._ray_start(i, [*where, *common], env)
            roots = self._new_roots(before)
            if not out.returncode:
                self._node_roots[i] = roots
                return
            # A port picked free may be taken by another process before the node binds it: what that attempt
            # started is ended and the node starts again on other ports.
            self._end(roots)
            if attempt == START_ATTEMPTS or "port" not in out.stdout + out.stderr:
                raise RuntimeError(f"ray start of node {i} failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")

    def _ray_start(self, i: int, args: List[str], env: Dict[str, str]) -> subprocess.CompletedProcess[str]:
        """One ``ray start`` of node ``i`` (``args``: where and what) on ports picked free now."""
        # Each node gets its own ports, distinct from each other and from the cluster's head port.
        picked = _free_ports(7, avoid=(self.port,))
        ports = [
            "--node-manager-port",
            str(picked[0]),
            "--object-manager-port",
            str(picked[1]),
            "--min-worker-port",
            "0",
            "--max-worker-port",
            "0",
            "--dashboard-agent-listen-port",
            str(picked[2]),
            "--dashboard-agent-grpc-port",
            str(picked[3]),
            "--runtime-env-agent-port",
            str(picked[4]),
            "--metrics-export-port",
            str(picked[5]),
        ]
        if i == 0:
            ports += ["--ray-client-server-port", str(picked[6])]
        resources = f'{{"node{i}": 1000}}'
        return subprocess.run(
            [
                sys.executable,
                "-c",
                _LOOPBACK_RAY_START,
                "start",
                *args,
                *ports,
                "--resources",
                resources,
                "--temp-dir",
                self.temp_dir,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),  # workers keep this as their working directory (see connect)
            preexec_fn=None if self.cores is None else _pin(self.cores[i]),
            timeout=int(os.environ.get("PFB_RAY_START_TIMEOUT", "300")),
        )

    def _new_roots(self, before: Set[int]) -> List[int]:
        """The daemons a ``ray start`` left running since ``before`` (pids), not a worker another node's raylet
        happened to spawn meanwhile."""
        started = {p.pid: p for p in self._processes(children=False) if p.pid not in before}
        return sorted(pid for pid, p in started.items() if _parent(p) not in before | set(started))

    def missing(self) -> List[int]:
        """The nodes not running now: ended by ``kill_node`` and not started again (or whose start failed)."""
        return [i for i in range(self.nodes) if i not in self._node_roots]

    def node_processes(self, i: int) -> List[Any]:
        """The live processes of node ``i``: what its ``ray start`` left running and all their children."""
        return _with_children(self._node_roots.get(i, []))

    def kill_node(self, i: int) -> List[int]:
        """SIGKILLs every process of node ``i`` at once (a machine lost, not a drain); returns their pids."""
        return self._end(self._node_roots.pop(i, []))

    @staticmethod
    def _end(roots: List[int]) -> List[int]:
        """SIGKILLs the processes ``roots`` and all their children at once; returns their pids."""
        import psutil

        procs = _with_children(roots)
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(procs, timeout=30)
        return [p.pid for p in procs]

    def connect(self, **kwargs: Any) -> None:
        """``ray.init`` of this driver into the cluster (from the temp directory: see init_local_cluster)."""
        import ray
        from ray._private import ray_constants

        # A driver resolves a loopback address to the machine's network address unless Ray is told this is a
        # single-machine setup; drivers this process starts (subprocesses) get the same setting.
        ray_constants.ENABLE_RAY_CLUSTER = False
        os.environ[SINGLE_MACHINE_ENV] = "0"
        here = os.getcwd()
        os.chdir(tempfile.gettempdir())
        try:
            ray.init(address=self.address, **{"log_to_driver": False, "logging_level": "ERROR", **kwargs})
            addresses = {n["NodeManagerAddress"] for n in ray.nodes()}
            if addresses != {LOOPBACK}:
                raise RuntimeError(f"the cluster's nodes listen on {addresses}, not only on {LOOPBACK}")
        finally:
            os.chdir(here)
        deadline = time.monotonic() + 120
        while len([n for n in ray.nodes() if n["Alive"]]) < self.nodes:
            if time.monotonic() > deadline:
                alive = len([n for n in ray.nodes() if n["Alive"]])
                raise RuntimeError(f"only {alive} of {self.nodes} Ray nodes are alive ({len(ray.nodes())} known)")
            time.sleep(0.2)

    def wait_for_nodes(self, timeout_s: float = 180.0) -> None:
        """Waits until exactly one live node carries each ``node{i}`` (a killed node declared dead by Ray)."""
        import ray

        deadline = time.monotonic() + timeout_s
        while True:
            alive = [n for n in ray.nodes() if n["Alive"]]
            if sorted(r for n in alive for r in n["Resources"] if re.fullmatch(r"node\d+", r)) == [
                f"node{i}" for i in range(self.nodes)
            ]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not settle on {self.nodes} live nodes: {len(alive)} alive")
            time.sleep(0.5)

    def node_ids(self) -> List[str]:
        """Node ids in the order the nodes started (index i carries the custom resource ``node{i}``)."""
        import ray

        by_resource: Dict[int, str] = {}
        for node in ray.nodes():
            if node["Alive"]:
                for i in range(self.nodes):
                    if f"node{i}" in node["Resources"]:
                        by_resource[i] = node["NodeID"]
        return [by_resource[i] for i in sorted(by_resource)]

    def _processes(self, children: bool = True) -> List[Any]:
        import psutil

        mine = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if any(self.temp_dir in part for part in (proc.info["cmdline"] or [])):
                    mine.append(proc)
            except psutil.Error:
                continue
        found = {p.pid: p for p in mine}
        for proc in mine if children else ():
            try:
                for child in proc.children(recursive=True):
                    found[child.pid] = child
            except psutil.Error:
                continue
        return list(found.values())

    def stop(self, grace_s: float = 10.0) -> None:
        """Ends every process of these nodes (SIGTERM, then SIGKILL after ``grace_s``) and removes the temp dir."""
        import psutil

        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except ImportError:
            pass
        procs = self._processes()
        for proc in procs:
            try:
                proc.send_signal(signal.SIGTERM)
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive + self._processes():
            try:
                proc.kill()
            except psutil.Error:
                continue
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _pin(cores: List[int]) -> Any:
    """A ``preexec_fn`` that keeps the started process (and so all it starts) on ``cores``."""

    def pin() -> None:
        os.sched_setaffinity(0, cores)

    return pin


def _with_children(roots: List[int]) -> List[Any]:
    """The live processes ``roots`` (pids) and all their children."""
    import psutil

    found: Dict[int, Any] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            found[pid] = root
            found.update((child.pid, child) for child in root.children(recursive=True))
        except psutil.Error:
            continue
    return list(found.values())


def _parent(proc: Any) -> int:
    import psutil

    try:
        return int(proc.ppid())
    except psutil.Error:
        return -1


def object_store_stats() -> Dict[str, Dict[str, int]]:
    """Object-store counters of each node (``cumulative_created_bytes``, ``object_store_bytes_used``, ...).

    Read from each raylet's own stats reply, keyed by node id; ``spilled_bytes_total`` says whether Ray spilled.
    """
    import ray
    from ray._private.internal_api import node_stats

    out = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        reply = node_stats(node["NodeManagerAddress"], node["NodeManagerPort"], include_memory_info=False)
        s = reply.store_stats
        out[node["NodeID"]] = {
            "created_bytes": int(s.cumulative_created_bytes),
            "created_objects": int(s.cumulative_created_objects),
            "used_bytes": int(s.object_store_bytes_used),
            "spilled_bytes": int(s.spilled_bytes_total),
        }
    return out
