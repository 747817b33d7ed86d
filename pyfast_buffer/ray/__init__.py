"""pyfast_buffer on Ray: a StalenessBuffer in an actor, and the client that producers and trainers share.

Needs the ``ray`` extra (``pip install 'pyfast_buffer[ray]'``). See docs/ray.md.
"""

from .client import RemoteBatch, RemoteBuffer

__all__ = ["RemoteBatch", "RemoteBuffer"]
