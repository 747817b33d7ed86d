"""The worker's generation loop: an asyncio loop on the worker's own thread that reserves the next prompt, waits
for admission (pace) or dispatches at once (drop, wait), generates the group's completions through ``complete``,
scores them and moves the group into the buffer.

Every group ends in exactly one place the ledger sees: completed into the buffer, failed (``complete`` kept raising,
or the worker stopped with it in flight), so there is never a silent hole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, List, Tuple

from pyfast_buffer.errors import AdmissionError
from pyfast_buffer.integrations.trl._scoring import build_samples, reward_name, score
from pyfast_buffer.integrations.trl._states import IN_FLIGHT, READY, RESERVED

logger = logging.getLogger("pyfast_buffer.trl")

POLL_S = 0.1  # how often a waiting loop looks at the stop flag and the trainer's version
ROOM_POLL_S = 0.01  # how often a finished group looks for room in a full buffer


def run(worker: Any) -> None:
    """The thread's body: runs the loop until stop() or a failure (kept for check_health)."""
    loop = asyncio.new_event_loop()
    worker._loop = loop
    try:
        loop.run_until_complete(_main(worker))
    except BaseException as exc:
        worker._error = exc
        logger.exception("pyfast_buffer TRL worker: generation failed")
    finally:
        worker._loop = None
        loop.close()


def wake(worker: Any) -> None:
    """Nudges the loop (it also polls the stop flag every POLL_S)."""
    loop = worker._loop
    if loop is not None and not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # closed between the check and the call
            loop.call_soon_threadsafe(lambda: None)


async def _main(worker: Any) -> None:
    slots = asyncio.Semaphore(worker.plan.max_inflight_groups)
    tasks: set = set()

    def finished(task: asyncio.Task) -> None:
        tasks.discard(task)
        slots.release()

    try:
        while not worker._stopping.is_set() and worker._error is None:
            worker._heartbeat = time.monotonic()
            try:
                await asyncio.wait_for(slots.acquire(), POLL_S)
            except asyncio.TimeoutError:
                continue
            if not await _room_ahead(worker):
                slots.release()
                continue
            group = _reserve(worker)
            step = await _admit(worker, group)
            if step is None:  # stopping while it waited
                slots.release()
                break
            task = asyncio.get_running_loop().create_task(_generate(worker, group, step))
            tasks.add(task)
            task.add_done_callback(finished)
    finally:
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


async def _room_ahead(worker: Any) -> bool:
    """Under wait: True once fewer than ``plan.max_ahead_groups`` groups are reserved, generating or ready (wait
    drops nothing, so this cap is what keeps a backlog from ageing past max_age: docs/trl.md, "wait"); else True."""
    cap = worker.plan.max_ahead_groups
    if cap is None:
        return True
    started = time.monotonic()
    while len(worker._groups) >= cap:
        if worker._stopping.is_set() or time.monotonic() - started > POLL_S:
            return False
        worker._heartbeat = time.monotonic()
        await asyncio.sleep(ROOM_POLL_S)
    return True


def _reserve(worker: Any) -> int:
    """The next prompt (a redo first, else the epoch's next index) under a new group id."""
    with worker._lock:
        if worker._redo:
            index = worker._redo.popleft()
        else:
            index = worker._cursor
            worker._cursor += 1
            if worker._cursor >= len(worker.dataset):
                worker._cursor = 0
                worker._epoch += 1
        group = worker._next_group
        worker._next_group += 1
        worker._groups[group] = {"index": index, "state": RESERVED, "step": None}
        return group


async def _admit(worker: Any, group: int) -> Any:
    """Dispatches ``group`` at the current step; under pace, once admitted (re-asked every POLL_S at the then
    current step). Returns the step, or None if the worker stops first (the group is then given back)."""
    buffer = worker.buffer
    while not worker._stopping.is_set():
        worker._heartbeat = time.monotonic()
        step = worker.step()
        if worker.strategy == "pace":
            try:
                await buffer.adispatch([group], step, timeout=POLL_S)
            except TimeoutError:
                continue
            except AdmissionError:
                if worker.step() != step:  # the trainer moved on while we asked: ask again with the new weights
                    continue
                raise  # the plan refuses every setting where this can happen (_options.plan); never a silent wait
            with worker._lock:
                worker._groups[group].update(state=IN_FLIGHT, step=step)
            return step
        with worker._lock:  # the stamp is read and used under the lock update_model_version takes: never stale
            step = worker.step()
            buffer.dispatch([group], step)
            worker._groups[group].update(state=IN_FLIGHT, step=step)
        return step
    with worker._lock:  # never dispatched: its prompt goes first next time
        entry = worker._groups.pop(group)
        worker._redo.appendleft(entry["index"])
    return None


async def _one(worker: Any, prompt_ids: List[int]) -> Tuple[List[int], List[float]]:
    """One completion, tried up to completion_attempts times."""
    for attempt in range(worker.completion_attempts):
        try:
            ids, logprobs = await worker.complete(list(prompt_ids), worker.max_completion_length)
            if len(ids) > worker.max_completion_length or len(logprobs) != len(ids):
                # The plan sizes TRL's token budget by max_completion_length: a longer sample could be dropped by
                # TRL's batcher, and logprobs must pair with the tokens. Counted as a failed attempt.
                raise ValueError(
                    f"complete returned {len(ids)} tokens and {len(logprobs)} logprobs for max_tokens="
                    f"{worker.max_completion_length}; return at most max_tokens tokens, one logprob each"
                )
            return [int(t) for t in ids], [float(x) for x in logprobs]
        except asyncio.CancelledError:
            raise
        except Exception:
            if attempt == worker.completion_attempts - 1:
                raise
            worker.counts["completion_retries"] += 1
    raise AssertionError("unreachable")


def longest_prompt(worker: Any) -> int:
    """The most tokens any prompt of the dataset has, rendered as ``_generate`` renders it (the chat template for
    message prompts); one pass over the dataset."""
    tokenizer = worker.processing_class
    return max((len(_tokenize(tokenizer, worker.dataset[i]["prompt"])) for i in range(len(worker.dataset))), default=0)


def _tokenize(tokenizer: Any, prompt: Any) -> List[int]:
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def _completion(tokenizer: Any, prompt: Any, ids: List[int]) -> Any:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    return text if isinstance(prompt, str) else [{"role": "assistant", "content": text}]


async def _generate(worker: Any, group: int, step: int) -> None:
    G = worker.num_generations
    try:
        row = dict(worker.dataset[worker._groups[group]["index"]])
        prompt = row["prompt"]
        tokenizer = worker.processing_class
        prompt_ids = _tokenize(tokenizer, prompt)
        results = await asyncio.gather(*[_one(worker, prompt_ids) for _ in range(G)])
        completion_ids = [ids for ids, _ in results]
        completions = [_completion(tokenizer, prompt, ids) for ids in completion_ids]
        rewards, advantages, per_function = await score(
            worker.reward_funcs, [prompt] * G, completions, completion_ids, row
        )
        samples = build_samples(
            prompt,
            prompt_ids,
            completions,
            completion_ids,
            [lp for _, lp in results],
            rewards,
            advantages,
            per_function,
            [reward_name(f) for f in worker.reward_funcs],
            model_version=step - worker._version_offset,
            group_id=group,
        )
    except asyncio.CancelledError:
        raise  # stop(): fail_unfinished fails it
    except Exception as exc:
        _fail(worker, group, exc)
        return
    await _into_buffer(worker, group, samples)


def _fail(worker: Any, group: int, exc: BaseException) -> None:
    with worker._lock:
        if worker._groups.pop(group, None) is None:
            return
        worker.buffer.fail([group])
        worker.counts["groups_failed"] += 1
        worker.counts["consecutive_failures"] += 1
        logger.warning("pyfast_buffer TRL worker: group %d failed: %r", group, exc)
        if worker.counts["consecutive_failures"] >= worker.max_consecutive_failures:
            worker._error = exc


async def _into_buffer(worker: Any, group: int, samples: List[Any]) -> None:
    """Completes the group once the buffer has room for it (ours is the only writer, so room stays)."""
    G = len(samples)
    trajectories = [group * G + k for k in range(G)]
    started = time.monotonic()
    while True:
        with worker._lock:
            if group not in worker._groups:  # failed by stop() meanwhile
                return
            buffer = worker.buffer
            if len(buffer) + G <= worker.plan.capacity:
                now = time.time()  # TRL's sample/time_in_queue_s counts from here, as from its own queue's put
                for sample in samples:
                    sample.enqueued_at = now
                worker._samples.update(zip(trajectories, samples))
                buffer.complete(trajectories, [group] * G)
                worker._groups[group]["state"] = READY
                worker.counts["consecutive_failures"] = 0
                worker.counts["groups_completed"] += 1
                waited = time.monotonic() - started
                if waited > ROOM_POLL_S:
                    worker.counts["backpressure_ms"] += int(waited * 1000)
                return
        if worker._stopping.is_set():
            return
        await asyncio.sleep(ROOM_POLL_S)


def fail_unfinished(worker: Any) -> None:
    """After stop(): fails every group still reserved or in flight (counted), so the ledger balances."""
    with worker._lock:
        for group, entry in list(worker._groups.items()):
            if entry["state"] == READY:
                continue
            if entry["state"] == IN_FLIGHT:
                worker.buffer.fail([group])
                worker.counts["stopped_in_flight"] += 1
            worker._groups.pop(group)
