"""The trainer callback behind ``worker.callbacks``: it checks TRL's config and builds the buffer when the trainer is
constructed, restores our state on resume, pushes our metrics after each step and saves our state into every
checkpoint. Imports transformers (TRL's dependency); loaded only when ``worker.callbacks`` is read.

Order matters and is TRL's: callbacks passed to the trainer run before the ones it adds itself, so on train begin
our restore runs before TRL's first weight sync and ``rollout_worker.start()``, and on step end our metrics are
pushed before TRL's weight sync and its ``log()`` (which drains ``metrics_queue``).
"""

from __future__ import annotations

import contextlib
import os
import queue
from typing import Any

from transformers import TrainerCallback

from pyfast_buffer.durable import readable_folder

#: The folder inside each ``checkpoint-N`` that holds our state.
STATE_FOLDER = "pyfast_buffer"


def checkpoint_folder(args: Any, state: Any) -> str:
    """``<output_dir>/checkpoint-<global_step>/pyfast_buffer``, where TRL's trainer writes that step's checkpoint."""
    return os.path.join(args.output_dir, f"checkpoint-{state.global_step}", STATE_FOLDER)


class StalenessWorkerCallback(TrainerCallback):
    """See the module docstring; one per worker."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.worker.configure(args)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        worker = self.worker
        if state.global_step == 0 or worker.restored_from is not None:
            return
        folder = checkpoint_folder(args, state)
        # readable_folder: a save killed between the two renames of its swap left the previous state aside, whole.
        if not os.path.isdir(readable_folder(folder)):
            raise FileNotFoundError(
                f"resuming at step {state.global_step}, but {folder} does not exist: the checkpoint was not written "
                "with this worker's callbacks. Call worker.load_state(<checkpoint>/pyfast_buffer) before train(), or "
                "resume from a checkpoint the worker saved"
            )
        worker.load_state(folder)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from pyfast_buffer.integrations.trl._metrics import ages, totals

        worker = self.worker
        values = ages(worker)
        if control.should_log or state.global_step >= state.max_steps:
            values.update(totals(worker))
        if values:
            with contextlib.suppress(queue.Full):  # TRL drains it in log(); one that never logs must not stop training
                worker.metrics_queue.put_nowait(values)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.worker.save_state(checkpoint_folder(args, state))


def make_callback(worker: Any) -> StalenessWorkerCallback:
    return StalenessWorkerCallback(worker)
