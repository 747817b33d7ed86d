"""``generate_rollout_fully_async``: slime's fully-async rollout shape (a persistent worker generating across
rollout calls) with the finished groups in our buffer, so each call takes ``rollout_batch_size`` whole groups at
step ``rollout_id`` under drop, wait or pace. slime is imported on first call only."""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any, Callable, Optional, cast

from pyfast_buffer.integrations.slime._options import WHERE
from pyfast_buffer.integrations.slime._source_core import StalenessSourceCore
from pyfast_buffer.integrations.slime._worker import Generate, RolloutWorker

logger = logging.getLogger(__name__)

DATA_SOURCE = "pyfast_buffer.integrations.slime.StalenessDataSource"

_worker: Optional[RolloutWorker] = None
_worker_lock = threading.Lock()

#: slime flags this rollout function does not act on (nor does slime's own fully-async rollout), with what happens.
IGNORED_FLAGS = {
    "partial_rollout": "an aborted group is generated again from its prompt (its tokens are discarded, so its age "
    "covers every token it is trained on)",
    "over_sampling_batch_size": "the worker keeps pyfast_buffer_concurrency groups generating instead",
    "dynamic_sampling_filter_path": "every finished group enters the buffer; filter in the trainer or use slime's "
    "own generate_rollout",
}
_warned: set = set()


def slime_generate() -> Generate:
    """slime's ``generate_and_rm_group`` with ``GenerateState``'s sampling params, as slime's worker calls it."""
    from slime.rollout.sglang_rollout import GenerateState, generate_and_rm_group

    async def generate(args: Any, group: Any) -> Any:
        params = GenerateState(args).sampling_params.copy()
        return await generate_and_rm_group(args, group, sampling_params=params, evaluation=False)

    return generate


def slime_concurrency(args: Any) -> int:
    """Groups generating at once: ``pyfast_buffer_concurrency``, else slime's worker's own
    ``sglang_server_concurrency * number of engines``."""
    given: Any = getattr(args, "pyfast_buffer_concurrency", None)
    if given is not None:  # a YAML value may come as a string of digits, as pyfast_buffer_max_age may
        if isinstance(given, str) and given.strip().isdigit():
            return int(given)
        return cast(int, given)  # anything not an int >= 1: RolloutWorker refuses it with the fix
    from slime.utils.http_utils import get_rollout_num_engines

    return args.sglang_server_concurrency * get_rollout_num_engines(args)


def ensure_worker(args: Any, source: StalenessSourceCore, generate: Generate, concurrency: int) -> RolloutWorker:
    """The one worker, (re)started for this data source: a new data source (a restarted manager) gets a new one."""
    global _worker
    with _worker_lock:
        if _worker is not None and (_worker.source is not source or not _worker.alive()):
            _worker.stop()
            _worker = None
        if _worker is None:
            _worker = RolloutWorker(args, source, generate, concurrency)
            _worker.start()
        return _worker


def stop_worker() -> None:
    """Stops the worker (its in-flight groups are failed and requeued): at exit, and between tests."""
    global _worker
    with _worker_lock:
        if _worker is not None:
            _worker.stop()
            _worker = None


atexit.register(stop_worker)


def collect_rollout(
    args: Any,
    rollout_id: int,
    data_source: Any,
    *,
    generate: Generate,
    concurrency: int,
    output: Callable[..., Any],
) -> Any:
    """One rollout call: ``rollout_batch_size`` groups trainable at step ``rollout_id``, ordered by sample index
    (slime's convention), as ``output(samples=..., metrics=...)``."""
    if not isinstance(data_source, StalenessSourceCore):
        raise TypeError(
            f"{WHERE}.generate_rollout_fully_async needs our data source, got {type(data_source).__name__}; "
            f"pass --data-source-path {DATA_SOURCE}"
        )
    if not getattr(args, "rollout_global_dataset", True):
        raise ValueError(
            f"{WHERE}: the fully-async rollout needs the global dataset: remove --disable-rollout-global-dataset"
        )
    _warn_ignored(args)
    per_step = data_source.options.per_step
    if per_step is None:
        raise ValueError(f"{WHERE}: needs --rollout-batch-size (the groups each rollout call returns)")
    data_source.begin_step(rollout_id)
    worker = ensure_worker(args, data_source, generate, concurrency)
    groups, metrics = data_source.take_batch(
        per_step, rollout_id, timeout=data_source.options.take_timeout, check=worker.check
    )
    groups.sort(key=_first_index)
    return output(samples=groups, metrics=metrics)


def generate_rollout_fully_async(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """``--rollout-function-path pyfast_buffer.integrations.slime.generate_rollout_fully_async``.

    The parameter names are slime's default rollout function's (slime's plugin contract checks them).
    ``evaluation=True`` (slime's ``--eval-function-path`` defaults to this function) runs slime's own evaluation
    rollout, which reads the eval datasets and not the data source."""
    from slime.rollout import sglang_rollout
    from slime.rollout.base_types import RolloutFnTrainOutput

    if evaluation:
        return sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation=True)
    return collect_rollout(
        args,
        rollout_id,
        data_source,
        generate=slime_generate(),
        concurrency=slime_concurrency(args),
        output=RolloutFnTrainOutput,
    )


def _warn_ignored(args: Any) -> None:
    """Logs once per flag that a slime flag set in ``args`` is not acted on here, and what happens instead."""
    for flag, instead in IGNORED_FLAGS.items():
        if getattr(args, flag, None) and flag not in _warned:
            _warned.add(flag)
            logger.warning(
                "%s: --%s is not used by generate_rollout_fully_async (nor by slime's own fully-async rollout): %s",
                WHERE,
                flag.replace("_", "-"),
                instead,
            )


def _first_index(group: Any) -> int:
    for sample in group:
        if isinstance(sample, list):
            return _first_index(sample)
        index = getattr(sample, "index", None)
        if index is not None:
            return int(index)
    return 0
