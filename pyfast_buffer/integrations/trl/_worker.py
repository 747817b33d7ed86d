"""``StalenessRolloutWorker``: TRL's ``RolloutWorkerProtocol`` with pyfast_buffer's staleness control inside.

The worker owns dispatch (``_generation`` runs its asyncio loop on a thread of its own), so ``pace`` is exact: a
group is started only once the buffer admits it. Steps are TRL's ``model_version`` (the trainer bumps it after every
weight sync), shifted after a resume so that they keep counting (``_version_offset``). A group is one prompt with
``num_generations`` completions: one buffer prompt id (TRL's ``group_id``, unique over the run) and one trajectory
id per completion (``group_id * num_generations + k``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

from pyfast_buffer.buffer import StalenessBuffer
from pyfast_buffer.integrations.trl import _options, _states
from pyfast_buffer.integrations.trl._options import WHERE, Plan
from pyfast_buffer.integrations.trl._queue import StalenessQueue

logger = logging.getLogger("pyfast_buffer.trl")

Complete = Callable[[List[int], int], Any]

#: Group states in ``_groups`` (what a checkpoint does with each: ``_checkpoint``), kept in ``_states``.
RESERVED, IN_FLIGHT, READY = _states.RESERVED, _states.IN_FLIGHT, _states.READY


class GenerationStopped(RuntimeError):
    """Generation stopped: ``check_health`` raises it, chained to the cause."""


class StalenessRolloutWorker:
    """A TRL ``rollout_worker`` that generates, scores and keeps groups in a ``StalenessBuffer``.

    Pass it with its callbacks: ``AsyncGRPOTrainer(..., rollout_worker=worker, callbacks=worker.callbacks)``; the
    callbacks check the trainer's config at construction, build the buffer, save our state into every
    ``checkpoint-N`` and restore it on ``train(resume_from_checkpoint=...)`` (docs/trl.md).

    Args:
        dataset: the prompts, a ``datasets.Dataset`` (or any sequence of dict rows) with a ``prompt`` column
            (a message list or a string); its other columns reach the reward functions.
        processing_class: the tokenizer (its chat template renders message prompts).
        reward_funcs: TRL reward functions (sync or async), summed per completion.
        num_generations: completions per prompt (TRL's ``num_generations``; the same value as the trainer's).
        max_completion_length: the most tokens a completion may have.
        strategy: ``"drop"``, ``"wait"`` or ``"pace"`` (docs/design.md, "Strategies").
        max_age: the largest ``model_version`` lag a trained sample may have (TRL's staleness).
        complete: ``async def complete(prompt_ids, max_tokens) -> (completion_ids, logprobs)``; default: a vLLM
            server at ``vllm_server_url`` (``vllm_complete``).
        groups_per_step: groups one optimizer step trains (default: from the trainer's batch size).
        max_inflight_groups: groups generating at once under drop and wait (default ``max(max_age, 1)`` times the
            groups per weight sync, TRL's own default); pace admits by its rule, within the same cap.
        lookahead: under pace, versions generation may run ahead (default ``max_age``).
        capacity: ready trajectories the buffer holds (default: from the trainer's ``queue_maxsize`` and the plan).
        completion_attempts: tries of one completion before its group is failed (counted, never a silent hole).
        max_consecutive_failures: groups failed in a row after which generation stops and ``check_health`` raises.
        stop_timeout: seconds ``stop()`` waits for generation in flight before it returns.
        vllm_server_url: the vLLM server of the default ``complete``.
        generation_kwargs: sampling fields of the default ``complete`` (temperature, top_p, ...).
    """

    def __init__(
        self,
        *,
        dataset: Any,
        processing_class: Any,
        reward_funcs: Any,
        num_generations: int,
        max_completion_length: int,
        strategy: str = "drop",
        max_age: int = 2,
        complete: Optional[Complete] = None,
        groups_per_step: Optional[int] = None,
        max_inflight_groups: Optional[int] = None,
        lookahead: Optional[int] = None,
        capacity: Optional[int] = None,
        completion_attempts: int = 3,
        max_consecutive_failures: int = 8,
        stop_timeout: float = 10.0,
        vllm_server_url: str = "http://localhost:8000",
        generation_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        if dataset is None or not hasattr(dataset, "__len__") or len(dataset) == 0:
            raise ValueError(f"{WHERE}: dataset must be a non-empty dataset of rows with a 'prompt' column")
        if processing_class is None:
            raise ValueError(f"{WHERE}: processing_class (the tokenizer) is required")
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if not funcs or not all(callable(f) for f in funcs):
            raise TypeError(f"{WHERE}: reward_funcs must be one callable or a list of callables")
        self.dataset = dataset
        self.processing_class = processing_class
        self.reward_funcs: Sequence[Any] = funcs
        self.num_generations = _options.positive_int(num_generations, "num_generations", 2)
        self.max_completion_length = _options.positive_int(max_completion_length, "max_completion_length")
        self.strategy = _options.strategy(strategy)
        self.max_age = _options.positive_int(max_age, "max_age", 0)
        self.groups_per_step = _options.optional_int(groups_per_step, "groups_per_step")
        self.max_inflight_groups = _options.optional_int(max_inflight_groups, "max_inflight_groups")
        self.lookahead = _options.optional_int(lookahead, "lookahead", 0)
        if self.lookahead is not None and (self.strategy != "pace" or self.lookahead > self.max_age):
            raise ValueError(f"{WHERE}: lookahead={lookahead} needs strategy='pace' and 0 <= lookahead <= max_age")
        self.capacity = _options.optional_int(capacity, "capacity")
        self.completion_attempts = _options.positive_int(completion_attempts, "completion_attempts")
        self.max_consecutive_failures = _options.positive_int(max_consecutive_failures, "max_consecutive_failures")
        self.stop_timeout = _options.positive_float(stop_timeout, "stop_timeout")
        if complete is None:
            from pyfast_buffer.integrations.trl._vllm import vllm_complete

            complete = vllm_complete(vllm_server_url, **(generation_kwargs or {}))
        elif not callable(complete):
            raise TypeError(f"{WHERE}: complete must be an async callable (prompt_ids, max_tokens) -> (ids, logprobs)")
        self.complete = complete

        self.rollout_buffer = StalenessQueue(self)
        self.metrics_queue: queue.Queue = queue.Queue(maxsize=4096)
        self.plan: Optional[Plan] = None
        self._buffer: Optional[StalenessBuffer] = None
        self._lock = threading.RLock()  # our bookkeeping; the buffer takes its own lock
        self._version = 0  # TRL's model_version, as update_model_version last said
        self._version_offset = 0  # steps = model_version + offset (0 until a resume says otherwise)
        self._resumed_version: Optional[int] = None  # the step a restored checkpoint was saved at, until mapped
        self._pending_staged_step: Optional[int] = None  # the step of restored staged samples, until mapped
        self._cursor = 0  # next dataset index of this epoch
        self._epoch = 0
        self._redo: Deque[int] = deque()  # dataset indices to generate again first (lost in flight by a restart)
        self._next_group = 0
        self._groups: Dict[int, Dict[str, Any]] = {}  # group id -> {index, step, state}
        self._samples: Dict[int, Any] = {}  # trajectory id -> RolloutSample, while ready
        self.counts: Counter = Counter()  # what the worker counts beside the buffer's ledger (docs/trl.md)
        self._ages: List[float] = []  # ages of the groups delivered since the last metrics push
        self._error: Optional[BaseException] = None
        self._heartbeat = time.monotonic()
        self._thread: Optional[threading.Thread] = None
        self._loop: Any = None
        self._stopping = threading.Event()
        self.restored_from: Optional[str] = None
        self._callbacks: Optional[list] = None
        self._longest_prompt: Optional[int] = None

    # ---- what the user and TRL see --------------------------------------------------------------------------
    @property
    def buffer(self) -> StalenessBuffer:
        """The ``StalenessBuffer`` (built when the trainer is constructed with ``callbacks=worker.callbacks``)."""
        if self._buffer is None:
            raise RuntimeError(
                f"{WHERE}.buffer is built when AsyncGRPOTrainer is constructed with callbacks=worker.callbacks "
                "(it reads the trainer's batch size and max_staleness); construct the trainer first"
            )
        return self._buffer

    @property
    def callbacks(self) -> list:
        """The trainer callbacks to pass as ``AsyncGRPOTrainer(callbacks=...)`` (one object, made once)."""
        if self._callbacks is None:
            from pyfast_buffer.integrations.trl._callback import make_callback

            self._callbacks = [make_callback(self)]
        return self._callbacks

    @property
    def model_version(self) -> int:
        return self._version

    def step(self) -> int:
        """The buffer's current step: TRL's model_version, shifted after a resume so steps keep counting."""
        return self._version + self._version_offset

    def update_model_version(self, model_version: int) -> None:
        """TRL calls it after each weight sync; the first call after a resume maps the checkpoint's step."""
        with self._lock:
            self._version = int(model_version)
            if self._resumed_version is not None:
                self._version_offset = self._resumed_version - self._version
                self._resumed_version = None
                if self._pending_staged_step is not None:  # the rest of a group handed out before the checkpoint
                    for sample in self.rollout_buffer._staged:
                        sample.model_version = self._pending_staged_step - self._version_offset
                    self._pending_staged_step = None

    def longest_prompt(self) -> int:
        """Tokens in the dataset's longest prompt, as generation renders it (computed once: a token budget's plan
        needs it, docs/trl.md "Batching")."""
        if self._longest_prompt is None:
            from pyfast_buffer.integrations.trl._generation import longest_prompt

            self._longest_prompt = longest_prompt(self)
        return self._longest_prompt

    def configure(self, args: Any, token_budget: Any = _options.FROM_CONFIG) -> None:
        """Checks the trainer's config and builds the buffer (the callback calls it at trainer construction, and at
        train start again when TRL has resolved ``token_budget=None`` to its server's ``max_model_len``)."""
        plan = _options.plan(self, args, token_budget)
        with self._lock:
            if self._thread is not None:
                raise RuntimeError(f"{WHERE}.configure: the worker is running; configure it before train()")
            self.plan = plan
            pace = self.strategy == "pace"
            bound = self.max_age - plan.margin
            self._buffer = StalenessBuffer(
                plan.capacity,
                max_age=bound,
                strategy=self.strategy,
                on_full="error",  # the loop checks room first (_generation.wait_for_room), under our lock
                pin_memory=False,
                track_released=True,
                prompts_per_step=plan.groups_per_version if pace else None,
                lookahead=(bound if self.lookahead is None else min(self.lookahead, bound)) if pace else None,
            )

    def start(self) -> None:
        """Starts generating (TRL calls it on train begin, after the first weight sync). Idempotent."""
        from pyfast_buffer.integrations.trl import _generation

        with self._lock:
            if self._thread is not None:
                return
            if self._buffer is None:
                raise RuntimeError(
                    f"{WHERE}.start(): the trainer was not built with callbacks=worker.callbacks, so the buffer is "
                    "not configured; pass them to AsyncGRPOTrainer"
                )
            self._stopping.clear()
            self._heartbeat = time.monotonic()
            self._thread = threading.Thread(target=_generation.run, args=(self,), name="pfb-trl-rollout", daemon=True)
            self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stops generation and returns within ``timeout`` (default ``stop_timeout``) seconds, generation in flight
        or not; what was in flight is failed in the buffer (counted), so the ledger still balances."""
        from pyfast_buffer.integrations.trl import _generation

        limit = self.stop_timeout if timeout is None else _options.positive_float(timeout, "timeout")
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        _generation.wake(self)
        thread.join(limit)
        if thread.is_alive():
            logger.warning("%s.stop(): generation did not finish within %.1f s; left to end on its own", WHERE, limit)
        _generation.fail_unfinished(self)
        self._thread = None

    def check_health(self, stale_after_s: float) -> None:
        """Raises GenerationStopped (chained to the cause) if generation failed, or stalled for ``stale_after_s``."""
        if self._error is not None:
            raise GenerationStopped(f"{WHERE}: generation stopped: {self._error!r}") from self._error
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self._stopping.is_set():
            raise GenerationStopped(f"{WHERE}: the generation thread ended without a reason")
        idle = time.monotonic() - self._heartbeat
        if thread is not None and idle > stale_after_s:
            raise GenerationStopped(f"{WHERE}: no generation progress for {idle:.0f} s (> {stale_after_s:.0f} s)")

    # ---- checkpoints (the callback calls them; _checkpoint says what is kept) ----------------------------------
    def save_state(self, folder: str, *, global_step: Optional[int] = None) -> None:
        """Writes our state (buffer, ready samples, epoch position) into ``folder`` as one unit: the previous folder
        or the new one, whole, survives a kill at any moment (``durable.write_folder``, docs/checkpoints.md).
        ``global_step``: the trainer step of the checkpoint it belongs to (the callback passes it; a resume checks
        it)."""
        from pyfast_buffer.integrations.trl import _checkpoint

        _checkpoint.save(self, folder, global_step)

    def load_state(self, folder: str, *, global_step: Optional[int] = None) -> None:
        """Restores what ``save_state`` wrote; call before ``train()`` (the callback does on resume). A save killed
        in the middle of its folder swap left the previous folder aside; it is found and read. Refused, changing
        nothing, when the state was saved with another ``num_generations`` or ``strategy``, another ``max_age``
        under wait or pace, or (``global_step`` given) for another trainer step."""
        from pyfast_buffer.integrations.trl import _checkpoint

        _checkpoint.load(self, folder, global_step)
        self.restored_from = folder

    def metrics(self) -> Dict[str, float]:
        """What the callback pushes to TRL's logs after each step (keys under ``pyfast_buffer/``)."""
        from pyfast_buffer.integrations.trl._metrics import step_metrics

        return step_metrics(self)
