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
checkpoint's folder or the new one, whole, and ``load`` reads both files inside ``durable.read_folder`` (a shared
lock against the swap: the two files are always of one save, even while a save of the same folder runs).

Integrity: ``buffer.pfb`` checks itself (length, sha256); ``manifest.json`` holds the sha256 of ``worker.json`` and
the digest recorded in ``buffer.pfb``, so a damaged ``worker.json``, or files of two saves, are refused. A load reads
and checks everything first and changes the worker only once all of it passed. ``worker.json`` of format 1 (written
before the manifest) is still read, without that check.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from pyfast_buffer import checkpoint, durable
from pyfast_buffer.integrations.trl._options import WHERE
from pyfast_buffer.integrations.trl._states import READY

#: ``worker.json``'s format: 2 has a manifest; 1 (earlier builds, no manifest) is still read.
FORMAT = 2
LEGACY_FORMAT = 1
BUFFER_FILE = "buffer.pfb"
STATE_FILE = "worker.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "pyfast_buffer.trl.folder/1"


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


def save(worker: Any, folder: str, global_step: Optional[int] = None) -> None:
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
                # What the state is only right for: a resume with other values is refused (check_identity).
                "num_generations": worker.num_generations,
                "strategy": worker.strategy,
                "max_age": worker.max_age,
                # pace admitted the ready groups for this rate: a trainer that takes fewer per sync ages them past it
                "groups_per_version": worker.plan.groups_per_version if worker.plan is not None else None,
                "margin": worker.plan.margin if worker.plan is not None else None,
                "global_step": global_step,
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
        encoded = json.dumps(state).encode("utf-8")
        with open(os.path.join(temporary, STATE_FILE), "wb") as f:
            f.write(encoded)
        digests = {
            STATE_FILE: hashlib.sha256(encoded).hexdigest(),
            BUFFER_FILE: checkpoint.recorded_digest(os.path.join(temporary, BUFFER_FILE)),
        }
        with open(os.path.join(temporary, MANIFEST_FILE), "w", encoding="utf-8") as f:
            json.dump({"format": MANIFEST_FORMAT, "sha256": digests}, f)

    durable.write_folder(folder, fill)


def check_identity(worker: Any, state: Dict[str, Any], path: str, global_step: Optional[int]) -> None:
    """Raises ValueError unless the saved state is one this worker can resume: the same num_generations (trajectory
    ids are ``group * num_generations + k``), the same strategy (pace's admission state means nothing to drop),
    the same max_age under wait and pace (their promises were made for it; drop simply drops by the new one), and,
    when the trainer says which step it resumes, that step's checkpoint."""
    saved_g = state.get("num_generations", worker.num_generations)
    if saved_g != worker.num_generations:
        raise ValueError(
            f"{WHERE}.load_state: {path} was saved with num_generations={saved_g}, this worker has "
            f"{worker.num_generations}; its groups cannot be read as groups of another size. Resume with "
            f"num_generations={saved_g}, or start a new run (a new output_dir, no resume_from_checkpoint)."
        )
    saved_strategy = state.get("strategy", worker.strategy)
    saved_age = state.get("max_age", worker.max_age)
    if saved_strategy != worker.strategy or (worker.strategy != "drop" and saved_age != worker.max_age):
        raise ValueError(
            f"{WHERE}.load_state: {path} was saved under strategy={saved_strategy!r}, max_age={saved_age}; this worker "
            f"runs strategy={worker.strategy!r}, max_age={worker.max_age}. Resume with the saved values (under drop "
            "max_age may change), or start a new run."
        )
    plan = worker.plan
    saved_rate = (state.get("groups_per_version"), state.get("margin"))
    if (
        worker.strategy == "pace"
        and plan is not None
        and None not in saved_rate
        and saved_rate != (plan.groups_per_version, plan.margin)
    ):
        raise ValueError(
            f"{WHERE}.load_state: {path} was saved under pace for a trainer that takes at least {saved_rate[0]} "
            f"group(s) per weight sync with a {saved_rate[1]}-sync margin; this trainer's batching gives "
            f"{plan.groups_per_version} with {plan.margin}, so the groups pace admitted for the old rate would "
            "be trained past max_age. Resume with the saved per_device_train_batch_size, "
            "gradient_accumulation_steps, weight_sync_steps and token_budget, or start a new run."
        )
    saved_step = state.get("global_step")
    if global_step is not None and saved_step is not None and saved_step != global_step:
        raise ValueError(
            f"{WHERE}.load_state: {path} holds the state of trainer step {saved_step}, but the trainer resumes at step "
            f"{global_step}: it belongs to another checkpoint. Resume from the checkpoint folder that holds it."
        )


def _read_manifest(folder: str) -> Optional[Dict[str, str]]:
    """The sha256 digests ``manifest.json`` records, or None where there is none (a folder of format 1)."""
    path = os.path.join(folder, MANIFEST_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        manifest = json.loads(raw)
        digests = manifest["sha256"] if manifest.get("format") == MANIFEST_FORMAT else None
    except (ValueError, TypeError, KeyError, AttributeError):
        digests = None
    if not (isinstance(digests, dict) and all(isinstance(digests.get(n), str) for n in (STATE_FILE, BUFFER_FILE))):
        raise checkpoint.CheckpointError(
            path, f"is not a manifest of this format ({MANIFEST_FORMAT}): damaged; resume from another checkpoint"
        )
    return digests


def _read(folder: str) -> Tuple[str, Dict[str, Any], str, Any]:
    """Reads and checks the folder's files, both of one save (``durable.read_folder``); changes nothing. Returns
    (worker.json's path, its state, buffer.pfb's path, the buffer's state tree)."""
    with durable.read_folder(folder) as where:
        path, buffer_path = os.path.join(where, STATE_FILE), os.path.join(where, BUFFER_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{WHERE}.load_state: {path} does not exist; pass the checkpoint's pyfast_buffer/")
        with open(path, "rb") as f:
            raw = f.read()
        digests = _read_manifest(where)
        tree = checkpoint.load_state(buffer_path)  # checks the file whole (length, sha256)
        buffer_digest = checkpoint.recorded_digest(buffer_path)
    if digests is not None and digests[STATE_FILE] != hashlib.sha256(raw).hexdigest():
        raise checkpoint.CheckpointError(
            path, f"fails the sha256 its {MANIFEST_FILE} records: the file is damaged; resume from another checkpoint"
        )
    if digests is not None and digests[BUFFER_FILE] != buffer_digest:
        raise checkpoint.CheckpointError(
            buffer_path, f"is not the buffer {MANIFEST_FILE} records: the folder mixes files of two saves"
        )
    try:
        state = json.loads(raw)
    except ValueError as exc:  # a format-1 file (no manifest) damaged
        raise checkpoint.CheckpointError(path, f"is not valid JSON ({exc}): damaged") from exc
    found = state.get("format") if isinstance(state, dict) else None
    if found not in (FORMAT, LEGACY_FORMAT):
        raise ValueError(f"{WHERE}.load_state: {path} has format {found!r}; this version reads {FORMAT}")
    if found == FORMAT and digests is None:
        raise checkpoint.CheckpointError(
            os.path.join(where, MANIFEST_FILE),
            f"is missing, but {STATE_FILE} (format {FORMAT}) was saved with one; restore the whole folder, or "
            "resume from another checkpoint",
        )
    return path, state, buffer_path, tree


def _ready_in(tree: Any) -> Optional[int]:
    """How many ready trajectories the buffer's state holds, or None where it is malformed (restore refuses it)."""
    entries = tree.get("entries") if isinstance(tree, dict) else None
    ids: Any = entries.get("traj_id") if isinstance(entries, dict) else None
    return len(ids) if hasattr(ids, "__len__") else None


def load(worker: Any, folder: str, global_step: Optional[int] = None) -> None:
    path, state, buffer_path, tree = _read(folder)
    check_identity(worker, state, path, global_step)
    if worker._thread is not None:
        raise RuntimeError(f"{WHERE}.load_state: the worker is running; load before train()")
    try:  # every value read before the worker changes: a malformed one changes nothing
        resumed, cursor = int(state["step"]), int(state["cursor"])
        epoch, next_group = int(state["epoch"]), int(state["next_group"])
        redo = [int(i) for i in state["redo"]]
        groups = {
            int(g): {"index": int(e["index"]), "step": int(e["step"]), "state": READY}
            for g, e in state["ready"].items()
        }
        samples = {int(r["trajectory"]): _sample(r) for r in state["samples"]}
        staged: List[Any] = [_sample(r) for r in state["staged"]]
        staged_step = int(state["staged_step"]) if staged else None
        counts = {str(k): int(v) for k, v in state["counts"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise checkpoint.CheckpointError(
            path, f"has a missing or malformed entry ({type(exc).__name__}: {exc}); resume from another checkpoint"
        ) from exc
    ready = _ready_in(tree)
    if ready is not None and ready != len(samples):
        raise ValueError(
            f"{WHERE}.load_state: {os.path.dirname(path)} holds {ready} ready trajectories in the buffer but "
            f"{len(samples)} samples; the folder is not one save"
        )
    buffer = worker.buffer
    with worker._lock:
        # The first change; it refuses a state the buffer cannot hold without changing it. In-flight prompts are
        # failed there (their work is lost).
        checkpoint.restore(buffer, tree, "fail", buffer_path)
        worker._resumed_version = resumed
        worker._cursor, worker._epoch, worker._next_group = cursor, epoch, next_group
        worker._redo.clear()
        worker._redo.extend(redo)
        worker._groups = groups
        worker._samples = samples
        worker.counts.clear()
        worker.counts.update(counts)
    worker.rollout_buffer._staged.clear()
    bound = worker.max_age - (worker.plan.margin if worker.plan is not None else 0)
    if staged and staged_step is not None and resumed - staged_step > bound:
        # The rest of a group handed out in part before the save, older than this worker's bound (a lower max_age
        # under drop): the next pull would deliver it past max_age, so it is dropped here, counted.
        worker.counts["staged_dropped_at_resume"] += len(staged)
        staged = []
    if staged:
        worker._pending_staged_step = staged_step
        worker.rollout_buffer._staged.extend(staged)
