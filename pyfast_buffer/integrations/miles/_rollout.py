"""``StalenessRolloutFn``: Miles's ``FullyAsyncRolloutFn`` whose producer asks our admission before each submission.

Loaded by ``--rollout-function-path pyfast_buffer.integrations.miles.StalenessRolloutFn`` *instead of*
``--fully-async`` (Miles refuses both: each selects the rollout function, and selecting is all ``--fully-async`` does).
Imports Miles, so ``pyfast_buffer.integrations.miles`` loads this module only when the name is used.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Dict, Optional, Tuple

from miles.rollout.fully_async_data_buffer import DataBufferConstructorInput
from miles.rollout.fully_async_rollout import FullyAsyncRolloutFn
from miles.utils.misc import should_run_periodic_action

from pyfast_buffer.integrations.miles._buffer import StalenessDataBuffer, check_args, chosen_strategy
from pyfast_buffer.integrations.miles._producer import run_producer
from pyfast_buffer.integrations.miles._state import state_path

logger = logging.getLogger(__name__)


def miles_saves_after(args: Any, rollout_id: int, rollouts_per_epoch: Optional[int]) -> bool:
    """Whether train_async.py writes a checkpoint after training ``rollout_id``, by its own rule."""
    sentinel = getattr(args, "save_trigger_sentinel", None)
    if sentinel and os.path.exists(sentinel):
        return True
    total = getattr(args, "num_rollout", None)
    if total is None and rollouts_per_epoch is not None:
        total = rollouts_per_epoch * int(getattr(args, "num_epoch", 1) or 1)
    return bool(should_run_periodic_action(rollout_id, getattr(args, "save_interval", None), rollouts_per_epoch, total))


def _hook_save(data_source: Any, after: Any) -> None:
    """Calls ``after(rollout_id)`` after the data source's own ``save``: Miles's RolloutManager.save calls it for
    every checkpoint it writes (with the default global dataset)."""
    original = getattr(data_source, "save", None)
    if original is None:
        return

    def save(rollout_id: int) -> None:
        original(rollout_id)
        after(rollout_id)

    data_source.save = save


def check_fully_async_args(args: Any) -> None:
    """What Miles checks under ``--fully-async``, checked here because this path replaces that flag."""
    where = "pyfast_buffer.integrations.miles.StalenessRolloutFn"
    if getattr(args, "colocate", False):
        raise ValueError(f"{where}: drop --colocate; rollout must keep generating while training runs")
    if getattr(args, "partial_rollout", False):
        raise ValueError(f"{where}: drop --partial-rollout; the fully-async rollout does not resume partial samples")
    if getattr(args, "pause_generation_mode", None) == "abort":
        raise ValueError(
            f"{where}: --pause-generation-mode abort would kill every in-flight generation at each weight update; "
            "use retract or in_place"
        )


class StalenessRolloutFn(FullyAsyncRolloutFn):
    """The fully-async rollout with our buffer in charge of when a prompt group may start.

    Strategy ``pace`` (the default; ``args.pyfast_buffer_strategy`` or ``PYFAST_BUFFER_STRATEGY`` picks ``wait``
    or ``drop``): before taking a prompt group from the data source, the producer asks our admission; a refused
    prompt stays in the data source (nothing is lost) and the producer waits until a take or a failure frees room.
    Steps are rollout ids: a group submitted during rollout k is stamped k and taken at a rollout <= k +
    ``--max-weight-staleness``; since Miles pushes weights at most once per rollout, its weight staleness is no
    larger. Each train call takes one whole batch (``rollout_batch_size`` groups), as pace's proof assumes.
    State is saved with the checkpoint (``--save``/``--save-interval``) and loaded on resume (``--load``).
    """

    def __init__(self, input: Any) -> None:
        check_fully_async_args(input.args)
        strategy = chosen_strategy(input.args, "pace")
        check_args(input.args, strategy, "rollout")  # at construction, before the first rollout call
        super().__init__(input)
        self._strategy = strategy
        self._saved: Optional[int] = None  # the rollout id whose state we last wrote
        self._kept: Optional[Tuple[int, Dict[str, Any]]] = None  # a call's end state a sentinel's save may want
        _hook_save(self.data_source, self._save_with_miles)

    async def __call__(self, input: Any) -> Any:
        if input.evaluation:
            return await self._call_eval(input)
        if getattr(self, "_worker", None) is None:  # Miles's attribute (its base is untyped for mypy here)
            self._output = StalenessDataBuffer(
                DataBufferConstructorInput(args=self.args, unused_handler_fn=self._handle_unused),
                strategy=self._strategy,
                clock="rollout",
            )
            self._resume(input.rollout_id)
            self._output.begin_step(input.rollout_id)
            self._worker = asyncio.create_task(self._worker_loop())
            logger.info("Started fully-async rollout worker under pyfast_buffer (%s)", self._strategy)
        self._output.begin_step(input.rollout_id)
        output = await self._drain(input)
        self._maybe_save(input.rollout_id)
        return output

    def _submit_one_group(self) -> asyncio.Task:
        samples = self.data_source.get_samples(1)
        self._scheduler.on_submit(samples)
        [prompt_group] = samples
        self._output.dispatch(prompt_group)
        return asyncio.create_task(self._generate_group(prompt_group))

    async def _worker_loop(self) -> None:
        await run_producer(
            self._output,
            resumed=self._producer_resumed,
            has_capacity=lambda pending: self._scheduler.has_capacity(
                pending_groups=pending, group_budget=self._max_in_flight_groups()
            ),
            wait_for_progress=self._scheduler.wait_for_progress,
            submit=self._submit_one_group,
        )

    def _resume(self, rollout_id: int) -> None:
        root = getattr(self.args, "load", None)
        if not root or rollout_id <= 0:
            return
        path = state_path(root, rollout_id - 1)
        if not os.path.exists(path):
            logger.warning("No pyfast_buffer state at %s: the buffer starts empty", path)
            return
        lost = self._output.load(path)
        for prompt_group in lost:  # generations cut off by the restart start again from their prompts
            self._recycle(prompt_group)
        logger.info("Loaded pyfast_buffer state from %s (%d prompt groups resubmitted)", path, len(lost))

    def _maybe_save(self, rollout_id: int) -> None:
        # train_async.py saves a checkpoint after training rollout k when should_run_periodic_action says so (its
        # interval, the last rollout, and each epoch boundary when the run is sized by --num-epoch), or when its
        # --save-trigger-sentinel file exists. Our state at the end of call k is what that checkpoint's resume (at
        # k + 1) must see: the groups taken by k are trained, the rest are not. The call for k + 1 may already run
        # when the checkpoint of k is written (train_async.py starts it first), so the state is taken here, at the
        # end of call k, and written now, or kept for a sentinel's save (``_save_with_miles``).
        root = getattr(self.args, "save", None)
        if not root:
            return
        if miles_saves_after(self.args, rollout_id, self._rollouts_per_epoch()):
            self._write_state(root, rollout_id, None)
        elif getattr(self.args, "save_trigger_sentinel", None):
            self._kept = (rollout_id, self._output.state_dict())

    def _rollouts_per_epoch(self) -> Optional[int]:
        """train_async.py's ``num_rollout_per_epoch``: set only when the run is sized by --num-epoch (this actor's
        args then have no --num-rollout; the driver computes it from the dataset as below)."""
        if getattr(self.args, "num_rollout", None) is not None:
            return None
        dataset = getattr(self.data_source, "dataset", None)
        return len(dataset) // int(self.args.rollout_batch_size) if dataset is not None else None

    def _write_state(self, root: str, rollout_id: int, state: Optional[Dict[str, Any]]) -> None:
        path = state_path(root, rollout_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._output.save(path, state)
        self._saved = rollout_id

    def _save_with_miles(self, rollout_id: int) -> None:
        """Miles is saving the checkpoint of ``rollout_id`` (its data source's ``save``): one our rule did not
        foresee (the sentinel appeared after the call ended) gets the state kept at that call's end."""
        root = getattr(self.args, "save", None)
        if not root or self._saved == rollout_id:
            return
        if self._kept is not None and self._kept[0] == rollout_id:
            self._write_state(root, rollout_id, self._kept[1])
            return
        logger.warning(
            "Miles saves rollout %d but pyfast_buffer kept no state for it; a resume from it starts our buffer empty",
            rollout_id,
        )
