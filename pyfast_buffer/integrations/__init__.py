"""Adapters that plug pyfast_buffer into training frameworks.

``pyfast_buffer.integrations.verl`` holds ``FastReplayBuffer``, a drop-in for verl's
``trainer.v1`` ReplayBuffer; it needs the ``verl`` extra (``pip install "pyfast_buffer[verl]"``),
so it is not imported here.
"""
