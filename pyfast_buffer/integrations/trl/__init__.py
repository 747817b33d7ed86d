"""pyfast_buffer in TRL: ``StalenessRolloutWorker``, a ``rollout_worker`` for TRL's ``AsyncGRPOTrainer``.

    from pyfast_buffer.integrations.trl import StalenessRolloutWorker

    worker = StalenessRolloutWorker(dataset=ds, processing_class=tok, reward_funcs=[accuracy], num_generations=8,
                                    max_completion_length=256, strategy="pace", max_age=2)
    trainer = AsyncGRPOTrainer(model=..., args=cfg, train_dataset=ds, rollout_worker=worker,
                               callbacks=worker.callbacks)

The worker generates (through ``complete``: vLLM by default, any async function on a CPU), scores and keeps the
groups in a ``StalenessBuffer``; the trainer drains ``worker.rollout_buffer``. Our filter runs before TRL's, so
TRL's ``sample/dropped_stale_total`` stays 0. ``cpu.use_cpu_kernels`` and ``cpu.CpuGenerator`` run the trainer on a
CPU. docs/trl.md has the setup, what differs from TRL's own filter and the figures. Tested with TRL 1.16.0
(``pip install "pyfast_buffer[trl]"``).

Nothing here imports TRL or transformers at import time: the worker imports them when it needs them.
"""

from __future__ import annotations

from pyfast_buffer.integrations.trl._worker import GenerationStopped, StalenessRolloutWorker

__all__ = ["GenerationStopped", "StalenessRolloutWorker"]
