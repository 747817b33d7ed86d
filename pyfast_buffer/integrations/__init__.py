"""Adapters that plug pyfast_buffer into training frameworks.

``pyfast_buffer.integrations.verl`` holds ``ReplayBuffer``, ``ReplayBufferAsync`` and
``FastReplayBuffer``, drop-ins for verl's ``trainer.v1`` replay buffers (docs/verl.md); it needs the
``verl`` extra (``pip install "pyfast_buffer[verl]"``), so it is not imported here.
"""
