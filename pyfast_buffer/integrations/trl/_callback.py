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
import sys
from typing import Any, Optional

from transformers import TrainerCallback

from pyfast_buffer.durable import readable_folder

#: The folder inside each ``checkpoint-N`` that holds our state.
STATE_FOLDER = "pyfast_buffer"


def checkpoint_folder(args: Any, state: Any) -> str:
    """``<output_dir>/checkpoint-<global_step>/pyfast_buffer``, where TRL's trainer writes that step's checkpoint."""
    return os.path.join(args.output_dir, f"checkpoint-{state.global_step}", STATE_FOLDER)


#: The transformers ``Trainer`` method whose local ``resume_from_checkpoint`` is the folder ``train()`` resumes from,
#: already resolved there (``True`` -> the last ``checkpoint-N`` of ``output_dir``).
_INNER_LOOP = "_inner_training_loop"
_NOT_FOUND = object()


def resumed_checkpoint() -> Any:
    """The checkpoint folder the running ``train()`` resumes from (None: a fresh start), read from the trainer's
    training loop up the call stack: a callback is told the restored step, never the folder, and a folder derived
    from ``output_dir`` and the step is another run's when the user resumes from elsewhere. ``_NOT_FOUND`` when no
    training loop is on the stack (a callback called by hand)."""
    frame: Optional[Any] = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == _INNER_LOOP and "resume_from_checkpoint" in frame.f_locals:
            value = frame.f_locals["resume_from_checkpoint"]
            return os.fspath(value) if value is not None else None
        frame = frame.f_back
    return _NOT_FOUND


class StalenessWorkerCallback(TrainerCallback):
    """See the module docstring; one per worker."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.worker.configure(args)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from pyfast_buffer.integrations.trl._options import resolved_budget

        worker = self.worker
        if worker.plan is not None and resolved_budget(args.token_budget) != worker.plan.token_budget:
            # TRL resolved token_budget=None to its server's max_model_len after our plan: plan for that budget.
            worker.configure(args)
            if worker.restored_from is not None:  # loaded by hand before train(): into the rebuilt buffer again
                worker.load_state(worker.restored_from)
        if state.global_step == 0 or worker.restored_from is not None:
            return
        resumed = resumed_checkpoint()
        folder = (
            checkpoint_folder(args, state)
            if resumed is _NOT_FOUND or resumed is None
            else (os.path.join(resumed, STATE_FOLDER))
        )
        # readable_folder: a save killed between the two renames of its swap left the previous state aside, whole.
        if not os.path.isdir(readable_folder(folder)):
            raise FileNotFoundError(
                f"resuming at step {state.global_step}, but {folder} does not exist: the checkpoint was not written "
                "with this worker's callbacks. Call worker.load_state(<checkpoint>/pyfast_buffer) before train(), or "
                "resume from a checkpoint the worker saved"
            )
        worker.load_state(folder, global_step=state.global_step)

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
        self.worker.save_state(checkpoint_folder(args, state), global_step=state.global_step)


def make_callback(worker: Any) -> StalenessWorkerCallback:
    return StalenessWorkerCallback(worker)
