"""The worker's state inside TRL's ``checkpoint-N/pyfast_buffer/``: the buffer (``buffer.pfb``, our durable format),
the ready groups' samples and the epoch position (``worker.json``).

What a resume does with each group, by where it was when the checkpoint was written:

- ready in the buffer, or handed out in part: kept, with its samples, and trained after the resume;
- reserved or generating: its generation is lost with the process, so the buffer fails it (counted in ``failed``)
  and the worker generates its prompt again first;
- trained, dropped or failed before: never generated again in that epoch. The position is the next prompt of the
  epoch, not the first untrained one, so a dropped group cannot hold it back (TRL #7274).

The folder goes through the package's folder writer (``durable.write_folder``: written and fsynced beside its final
name, then swapped into place), so a process killed during the save (Ctrl-C, SIGKILL) leaves the previous
checkpoint's folder or the new one, whole, and ``load`` reads it through ``durable.readable_folder``
(docs/checkpoints.md).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

from pyfast_buffer import checkpoint, durable
from pyfast_buffer.integrations.trl._options import WHERE
from pyfast_buffer.integrations.trl._states import READY

FORMAT = 1
BUFFER_FILE = "buffer.pfb"
STATE_FILE = "worker.json"


def _sample_record(trajectory: int, sample: Any) -> Dict[str, Any]:
    return {
        "trajectory": trajectory,
        "prompt": sample.prompt,
        "completion": sample.completion,
        "input_ids": sample.input_ids.tolist(),
        "completion_mask": sample.completion_mask.tolist(),
        "old_log_probs": sample.old_log_probs.tolist(),
        "advantage": sample.advantage,
        "group_id": sample.group_id,
        "metrics": sample.metrics,
    }


def _sample(record: Dict[str, Any]) -> Any:
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    return RolloutSample(
        prompt=record["prompt"],
        completion=record["completion"],
        input_ids=np.asarray(record["input_ids"], dtype=np.int64),
        completion_mask=np.asarray(record["completion_mask"], dtype=np.int64),
        old_log_probs=np.asarray(record["old_log_probs"], dtype=np.float32),
        advantage=float(record["advantage"]),
        model_version=0,  # set when it is handed out, in the trainer's version space of the resumed run
        group_id=int(record["group_id"]),
        metrics=dict(record["metrics"]),
    )


def save(worker: Any, folder: str) -> None:
    durable.make_directories(os.path.dirname(os.path.abspath(folder)))

    def fill(temporary: str) -> None:
        # Plain writes (fsync=False): durable.write_folder fsyncs every file of the folder before it is swapped in.
        staged = worker.rollout_buffer._staged
        with worker._lock:
            checkpoint.save_state(worker.buffer.state_dict(), os.path.join(temporary, BUFFER_FILE), fsync=False)
            ready = {g: e for g, e in worker._groups.items() if e["state"] == READY}
            lost = [e["index"] for e in worker._groups.values() if e["state"] != READY]
            state = {
                "format": FORMAT,
                "step": worker.step(),
                "cursor": worker._cursor,
                "epoch": worker._epoch,
                "next_group": worker._next_group,
                "redo": lost + list(worker._redo),
                "ready": {str(g): {"index": e["index"], "step": e["step"]} for g, e in ready.items()},
                "samples": [_sample_record(t, s) for t, s in worker._samples.items()],
                "staged": [_sample_record(-1, s) for s in staged],
                "staged_step": None,
                "counts": dict(worker.counts),
            }
            if staged:
                state["staged_step"] = staged[0].model_version + worker._version_offset
        with open(os.path.join(temporary, STATE_FILE), "w", encoding="utf-8") as f:
            json.dump(state, f)

    durable.write_folder(folder, fill)


def load(worker: Any, folder: str) -> None:
    folder = durable.readable_folder(folder)  # the previous save, if one was killed while swapping its folder in
    path = os.path.join(folder, STATE_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{WHERE}.load_state: {path} does not exist; pass the checkpoint's pyfast_buffer/")
    with open(path, encoding="utf-8") as f:
        state = json.load(f)
    if state.get("format") != FORMAT:
        raise ValueError(f"{WHERE}.load_state: {path} has format {state.get('format')!r}; this version reads {FORMAT}")
    if worker._thread is not None:
        raise RuntimeError(f"{WHERE}.load_state: the worker is running; load before train()")
    buffer = worker.buffer
    with worker._lock:
        buffer.load(os.path.join(folder, BUFFER_FILE))  # in-flight prompts are failed there (their work is lost)
        worker._resumed_version = int(state["step"])
        worker._cursor = int(state["cursor"])
        worker._epoch = int(state["epoch"])
        worker._next_group = int(state["next_group"])
        worker._redo.clear()
        worker._redo.extend(int(i) for i in state["redo"])
        worker._groups = {
            int(g): {"index": int(e["index"]), "step": int(e["step"]), "state": READY}
            for g, e in state["ready"].items()
        }
        worker._samples = {int(r["trajectory"]): _sample(r) for r in state["samples"]}
        staged: List[Any] = [_sample(r) for r in state["staged"]]
        worker.counts.clear()
        worker.counts.update(state["counts"])
        if len(buffer) != len(worker._samples):
            raise ValueError(
                f"{WHERE}.load_state: {folder} holds {len(buffer)} ready trajectories in the buffer but "
                f"{len(worker._samples)} samples; the folder is not one save"
            )
    worker.rollout_buffer._staged.clear()
    if staged:
        worker._pending_staged_step = int(state["staged_step"])
        worker.rollout_buffer._staged.extend(staged)
