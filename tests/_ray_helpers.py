"""Helpers of the Ray tests (the session's cluster itself is the ``ray_cluster`` fixture in conftest.py)."""

from __future__ import annotations


def kill_named_actors(namespace: str) -> None:
    """Ends every named actor of ``namespace`` (the detached buffers and payload owners a test left behind)."""
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["namespace"] == namespace:
            try:
                ray.kill(ray.get_actor(actor["name"], namespace=namespace), no_restart=True)
            except ValueError:
                continue
