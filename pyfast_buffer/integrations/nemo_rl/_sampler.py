"""``StalenessSampler``: pyfast_buffer as NeMo RL's ``PromptGroupSampler`` (``async_rl.sampler: {name: custom}``).

NeMo's single-controller actor runs two asyncio pumps on one event loop: the rollout pump awaits ``admit`` before
each batch of prompts, the train pump awaits ``evict`` then ``select`` until a step has its groups, and after each
optimizer step it asks ``should_abort_inflight`` about every unfinished attempt. NeMo's buffer stays the store of
record; the native core decides (``_groups`` says how it follows the buffer):

- ``drop``: ``select`` takes the stalest groups within ``max_age``, ``evict`` removes (and clears) the ones past it,
  and ``should_abort_inflight`` stops an attempt that can no longer be trained in time (``abort_inflight``).
- ``wait``: nothing is dropped; ``select`` takes nothing while an unfinished attempt has reached ``max_age``.
- ``pace``: ``admit`` lets a batch go only when the pace rule admits ``prompts_per_step`` more groups (it awaits the
  core's wake-ups, never blocking the loop), and ``select`` takes through the core's gate: nothing is dropped and
  nothing trained past ``max_age``.

Versions: NeMo's trainer version ``v`` (optimizer steps done) is our step; a group's start weight version is its
stamp and its end weight version its finish step, so its age at ``v`` is ``v - start`` (NeMo's "lag"). Absolute
imports only; no NeMo import (NeMo duck-types the protocol).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Dict, Optional, Tuple

from pyfast_buffer import aio, checkpoint
from pyfast_buffer.batch import metrics_prefix
from pyfast_buffer.buffer import StalenessBuffer
from pyfast_buffer.integrations._common import ages_metrics, buffer_metrics
from pyfast_buffer.integrations.nemo_rl._groups import READY, GroupBook
from pyfast_buffer.integrations.nemo_rl._options import WHERE, Options, parse

logger = logging.getLogger("pyfast_buffer.nemo_rl")

#: What the sampler counts beside the core's ledger (docs/nemo_rl.md, "The ledger").
BOOK_COUNTS = (
    "aborted",
    "vanished",
    "restored",
    "started_unadmitted",
    "evicted_unadmitted",
    "admitted_late",
    "started_before_admission",
    "lost_in_resume",
    "slots_returned",
    "given_up",
    "dropped_at_resume",
)
#: The ``format`` of the tree ``save_state`` writes (core and group map, one file).
STATE_FORMAT = "pyfast_buffer.nemo_rl.sampler/2"
#: Where earlier builds kept the group map, beside the core file (still read on load; removed by the next save).
LEGACY_GROUPS_SUFFIX = ".groups.json"
ADMIT_RECHECK_S = 0.05  # admit also watches the trainer's version, which no core change announces


_MAP_KEYS = ("groups", "next_pid", "counts", "ghosts")


def _map(path: str, state: Any) -> Dict[str, Any]:
    """The sampler's group map from ``path``, checked whole and converted (ints, strings), before a load changes
    anything; a missing key or a malformed entry raises CheckpointError naming the file and the key."""
    if not isinstance(state, dict):
        raise checkpoint.CheckpointError(path, f"holds no sampler group map (a dict with {', '.join(_MAP_KEYS)})")
    missing = [key for key in _MAP_KEYS if key not in state]
    if missing:
        raise checkpoint.CheckpointError(
            path,
            f"has a group map without {', '.join(repr(k) for k in missing)}: damaged or not written by "
            "StalenessSampler.save_state; restore it from the same save, or remove the state_path file to start fresh",
        )
    try:
        groups = {
            str(gid): (int(pid), str(status), int(stamp)) for gid, (pid, status, stamp) in state["groups"].items()
        }
        counts = {str(k): int(v) for k, v in state["counts"].items()}
        return {"groups": groups, "next_pid": int(state["next_pid"]), "counts": counts, "ghosts": int(state["ghosts"])}
    except (TypeError, ValueError, AttributeError) as exc:
        raise checkpoint.CheckpointError(path, f"has a malformed group map ({type(exc).__name__}: {exc})") from exc


class StalenessSampler:
    """A NeMo RL ``PromptGroupSampler`` over pyfast_buffer's core (this module's docstring says how).

    Load it with ``async_rl.sampler: {name: custom, target: "pyfast_buffer.integrations.nemo_rl:StalenessSampler",
    max_age: 2, strategy: drop}``; the other keys are ``prompts_per_step`` (pace: NeMo's ``num_prompts_per_step``,
    else learned from ``required_buffer_capacity``), ``lookahead``, ``capacity``, ``age_from``, ``abort_inflight``,
    ``starvation_share``, ``state_path`` (our state, kept beside NeMo's checkpoints) and ``slot_lease_s``.
    """

    #: NeMo RL #3480's protocol member: our resume goes through ``state_path`` and the groups NeMo restores.
    supports_buffer_checkpoint = False

    def __init__(self, buffer: Any, **extras: Any) -> None:
        self.options: Options = parse(extras)
        self._buffer = buffer
        self._per_step = self.options.prompts_per_step
        self._core: Optional[StalenessBuffer] = None
        self._book: Optional[GroupBook] = None
        self._resume_step: Optional[int] = None
        self._loaded = False  # whether state_path was read (on a resume only: set_dispatch_index > 0)
        self._next_target = 0  # pace: the trainer version the next admitted batch is trained at
        self._taken_at: Dict[int, int] = {}  # pace: groups select handed to each trainer version
        self._short_at: Dict[int, int] = {}  # pace: groups NeMo gave up on, per trainer version (see select)
        #: Ages (trainer steps) of the groups the last ``select`` returned (NeMo RL #3759 reads this name).
        self.last_selection_trajectory_ages: list = []
        if self.options.strategy != "pace" or self._per_step is not None:
            self._build()
        self._wrap_buffer_events()

    # ---- the core ----------------------------------------------------------------------------------------
    def _build(self) -> None:
        o = self.options
        pace = o.strategy == "pace"
        self._core = StalenessBuffer(
            o.capacity,
            max_age=o.max_age,
            strategy=o.strategy,
            on_full="error",
            pin_memory=False,
            track_released=True,
            prompts_per_step=self._per_step if pace else None,
            lookahead=o.lookahead if pace else None,
            age_from=o.age_from,
            starvation_share=o.starvation_share,
        )
        self._book = GroupBook(self._buffer, self._core, pace, o.slot_lease_s)
        self._resume_from_state()

    def _resume_from_state(self) -> None:
        """On a resume (``set_dispatch_index`` > 0) with the core built: reads ``state_path`` once, then drops the
        ready groups a tighter bound can no longer train (a resume may lower ``max_age``; kept, they were trained
        past it). A fresh run (``set_dispatch_index(0)``) never reads it: that file is an earlier run's."""
        path, step = self.options.state_path, self._resume_step
        if self._loaded or self._core is None or path is None or not step or not os.path.exists(path):
            return
        self._load_state(path)
        self._loaded = True
        dropped = self._evict_stale(step) if self.options.strategy in ("drop", "pace") else 0
        if dropped:
            self.book.counts["dropped_at_resume"] += dropped
            logger.warning(
                "%d restored groups are older than max_age=%d at trainer version %d (saved under a larger bound?): "
                "dropped, so none is trained past the bound",
                dropped,
                self.options.max_age,
                step,
            )

    @property
    def core(self) -> StalenessBuffer:
        if self._core is None:
            raise RuntimeError(
                f"{WHERE}: strategy=pace needs prompts_per_step; set it (NeMo's grpo.num_prompts_per_step), or let "
                "NeMo call required_buffer_capacity first"
            )
        return self._core

    @property
    def book(self) -> GroupBook:
        self.core  # noqa: B018 (raises the message above)
        assert self._book is not None
        return self._book

    def _wrap_buffer_events(self) -> None:
        """Sees every attempt: reserve, commit and remove_group of NeMo's buffer are wrapped on the instance."""
        buffer = self._buffer
        reserve: Any = getattr(buffer, "reserve", None)
        commit: Any = getattr(buffer, "commit", None)
        remove_group: Any = getattr(buffer, "remove_group", None)
        sampler = self

        def index_of(gid: str) -> Optional[int]:
            """The entry's index, found without a scan of the lists when NeMo's buffer names its entries."""
            if sampler._core is None:
                return None
            ids = getattr(buffer, "_group_ids", None)
            if ids is None:
                return sampler.book.indices().get(gid)
            if ids and ids[-1] == gid:  # a reserve appends
                return len(ids) - 1
            try:
                return ids.index(gid)
            except ValueError:
                return None

        if reserve is not None:

            def reserved(*args: Any, **kwargs: Any) -> Any:
                gid = reserve(*args, **kwargs)
                i = index_of(str(gid))
                if i is not None:
                    sampler.book.on_reserve(str(gid), int(buffer.start_weight_list[i]))
                return gid

            buffer.reserve = reserved
        if commit is not None:

            async def committed(group_id: Any, *args: Any, **kwargs: Any) -> Any:
                meta = await commit(group_id, *args, **kwargs)
                i = index_of(str(group_id))
                if i is not None:
                    lengths = getattr(meta, "sequence_lengths", None)
                    length = sum(lengths) / len(lengths) if lengths else None
                    start, end = int(buffer.start_weight_list[i]), int(buffer.end_weight_list[i])
                    sampler.book.on_commit(str(group_id), start, max(end, start), length)
                return meta

            buffer.commit = committed
        if remove_group is not None:

            async def removed(group_id: Any, *args: Any, **kwargs: Any) -> Any:
                if sampler._core is not None:
                    sampler.book.on_remove(str(group_id))
                return await remove_group(group_id, *args, **kwargs)

            buffer.remove_group = removed

    # ---- NeMo's protocol -----------------------------------------------------------------------------------
    @property
    def is_on_policy(self) -> bool:
        """True when nothing older than the trainer's version is trained (``max_age: 0``)."""
        return self.options.max_age == 0

    def required_buffer_capacity(self, groups_per_step: int) -> Optional[int]:
        """Under pace, the groups pace's window holds: ``(lookahead + 1) * prompts_per_step``; else None."""
        if self._per_step is None:
            self._per_step = int(groups_per_step)
        if self._core is None:
            self._build()
        if self.options.strategy != "pace":
            return None
        lookahead = self.options.lookahead if self.options.lookahead is not None else self.options.max_age
        return (lookahead + 1) * int(self._per_step or groups_per_step)

    def set_dispatch_index(self, resume_from_step: int) -> None:
        """NeMo's resume hook (the trainer version it restarts at); 0 on a fresh run."""
        if isinstance(resume_from_step, bool) or not isinstance(resume_from_step, int) or resume_from_step < 0:
            raise ValueError(f"resume_from_step={resume_from_step!r} must be an int >= 0")
        self._resume_step = resume_from_step
        self._next_target = resume_from_step
        path = self.options.state_path
        if resume_from_step == 0 and path is not None and os.path.exists(path) and not self._loaded:
            logger.warning(
                "a fresh run (resume_from_step=0) does not read %s, an earlier run's sampler state; it is replaced at "
                "this run's first save. Resume from NeMo's checkpoint to continue that run",
                path,
            )
        self._resume_from_state()
        if resume_from_step > 0 and self.options.state_path is None:
            logger.warning(
                "resuming at trainer version %d without state_path: the sampler's ledger starts empty and the "
                "attempts lost in the restart are not counted; set state_path (beside NeMo's checkpoints)",
                resume_from_step,
            )

    async def admit(self, *, trainer_version_fn: Callable[[], int]) -> Optional[int]:
        """Returns when the next batch of prompts may start: at once under drop and wait (None: no target step);
        under pace when the rule admits ``prompts_per_step`` more groups, which it then holds for them, returning
        the trainer version the batch is trained at. Pace's steps each take ``prompts_per_step`` groups in
        admission order, so the k-th batch admitted since the resume version r is trained at r + k, within
        ``lookahead`` of its admission. NeMo stamps the batch's attempts with it and, when it gives up on a
        prompt, closes that step one group short (``_credit_shortfall``) instead of waiting for it."""
        if self.options.strategy != "pace":
            return None
        core, book, per_step = self.core, self.book, int(self._per_step or 0)
        while True:
            book.observe()
            # Stamped with the trainer's version: NeMo starts a prompt only while its dispatch gate is open, and the
            # gate is closed from the trainer's step until generation has its weights (a retry that starts older
            # is admitted on its own, and a start older than its slot's stamp is counted).
            stamp = int(trainer_version_fn())
            if core.admissible(stamp) >= per_step:
                pids = book.new_pids(per_step)
                core.dispatch(pids, stamp, lease=self.options.slot_lease_s)
                book.slots.extend(pids)
                book.slot_stamps.update(dict.fromkeys(pids, stamp))
                target, self._next_target = self._next_target, self._next_target + 1
                return target
            await aio.changed(core, ADMIT_RECHECK_S)

    async def evict(self, *, current_train_weight: int) -> int:
        """Removes (and clears) the groups we dropped: past ``max_age`` under drop, or refused by pace's rule."""
        book = self.book
        index = book.observe()
        if self.options.strategy == "drop":
            self._evict_stale(current_train_weight)
        gone = [gid for gid in book.to_evict if gid in index and self._buffer.ready_list[index[gid]]]
        book.to_evict -= set(gone) | {gid for gid in book.to_evict if gid not in index}
        if not gone:
            return 0
        for gid in gone:
            book.forget(gid)
        # No await between reading the indices and remove(): NeMo's remove deletes before its first await.
        return int(await self._buffer.remove([index[g] for g in gone], remove_in_dp=True))

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> Tuple[Optional[Any], int]:
        """Takes between ``min_prompt_groups`` and ``max_prompt_groups`` whole groups, stalest first, as the
        strategy allows; removes them from NeMo's buffer (its rows stay for the trainer) and returns
        ``(meta, n)``, or ``(None, 0)`` when fewer than ``min_prompt_groups`` may go now."""
        if min_prompt_groups < 1 or max_prompt_groups < min_prompt_groups:
            raise ValueError(
                f"min_prompt_groups={min_prompt_groups}, max_prompt_groups={max_prompt_groups}: need 1 <= min <= max"
            )
        core, book, step = self.core, self.book, int(current_train_weight)
        index = book.observe()
        if self.options.strategy == "drop":
            self._evict_stale(step)
        if self.options.strategy == "pace" and self._per_step:
            # NeMo asks a step for its target less what it has: a target below prompts_per_step means it gave up
            # on prompts of that step's batch (_credit_shortfall); their slots must stop holding pace's gate.
            short = int(self._per_step) - self._taken_at.get(step, 0) - int(max_prompt_groups)
            if short > self._short_at.get(step, 0):
                book.give_up(short - self._short_at.get(step, 0), step)
                self._short_at[step] = short
        ready = len(core) - book.ghosts
        if ready < min_prompt_groups:
            return None, 0
        batch = core.take(min(max_prompt_groups, ready), step)  # never blocks: under wait or pace, empty if gated
        core.released()  # the ids that left are the batch's: nothing else to learn from them
        named = book.gids(batch.traj_ids.tolist())
        gids = [g for g in named if g is not None]
        book.ghosts -= len(named) - len(gids)  # ghosts met on the way are gone from the core now
        if not gids:
            return None, 0
        idxs = [index[g] for g in gids]
        starts = self._buffer.start_weight_list
        self.last_selection_trajectory_ages = [step - int(starts[i]) for i in idxs]
        metas = [self._buffer.meta_list[i] for i in idxs]
        for gid in gids:
            book.forget(gid)
        if self.options.strategy == "pace":
            self._taken_at[step] = self._taken_at.get(step, 0) + len(gids)
            for old in [v for v in self._taken_at if v < step - 1]:
                self._taken_at.pop(old, None)
                self._short_at.pop(old, None)
        removed = int(await self._buffer.remove(idxs, remove_in_dp=False))
        self._after_select(step, len(gids))
        return metas[0].concat(*metas[1:]), removed

    def should_abort_inflight(self, *, start_weight_version: int, current_train_weight: int) -> bool:
        """Under drop (with ``abort_inflight``): an unfinished attempt that started before ``v - max_age`` can no
        longer be trained in time; stopping it saves its generation (NeMo does not retry it: counted ``aborted``)."""
        if self.options.strategy != "drop" or not self.options.abort_inflight:
            return False
        stale = int(start_weight_version) < int(current_train_weight) - self.options.max_age
        if stale and self._book is not None:
            self._book.counts["aborted"] += 1
        return stale

    # ---- ours ---------------------------------------------------------------------------------------------
    def _evict_stale(self, step: int) -> int:
        """Drops the ready groups past max_age in the core (NeMo's copies go at the next evict()); returns how many."""
        if not self.core.evict_stale(step):
            return 0
        gone = self.book.gids(self.core.released().ids.tolist())
        for gid in gone:
            if gid is not None:
                self.book.to_evict.add(gid)
                self.book.groups[gid].status = "dropped"
        return len(gone)

    def _after_select(self, step: int, taken: int) -> None:
        book = self.book
        ledger = self.core.ledger()
        logger.info(
            "step=%d taken=%d age_max=%s dropped_stale=%d failed=%d in_flight=%d ready=%d aborted=%d vanished=%d",
            step,
            taken,
            max(self.last_selection_trajectory_ages, default=0),
            ledger["dropped_stale"],
            ledger["failed"],
            ledger["in_flight"],
            ledger["buffer_left"] - book.ghosts,
            book.counts["aborted"],
            book.counts["vanished"],
        )
        if self.options.state_path is not None:
            self.save_state(self.options.state_path)

    def ledger(self) -> Dict[str, int]:
        """The core's ledger (one entry per prompt-group attempt; under pace also per admitted slot) and what this
        sampler counted besides (``BOOK_COUNTS``, each in docs/nemo_rl.md), ``ghosts`` and ``slots_open``. Every
        attempt NeMo started is ``dispatched - slots_open + started_unadmitted``; each is completed, failed or in
        flight."""
        out = dict(self.core.ledger())
        for key in BOOK_COUNTS:
            out[key] = int(self.book.counts[key])
        out["ghosts"] = self.book.ghosts
        out["slots_open"] = len(self.book.slots)  # pace: admitted slots no attempt has taken (yet, or ever)
        return out

    def metrics(self) -> Dict[str, float]:
        """The age of the last selection (mean, max: NeMo RL #3758), the ledger and the data metrics (starvation,
        the bias monitor), for the trainer's logger."""
        out = buffer_metrics(self.core)
        prefix = metrics_prefix()
        out.update({f"{prefix}{k}": float(v) for k, v in self.ledger().items() if f"{prefix}{k}" not in out})
        out.update(ages_metrics(self.last_selection_trajectory_ages))
        return out

    # ---- our state across a resume ----------------------------------------------------------------------------
    def save_state(self, path: str) -> None:
        """Writes the core and the group map to ``path`` as one checkpoint file (``checkpoint.save_state``): a
        process killed during the save leaves the previous state or the new one, whole (docs/checkpoints.md)."""
        book = self.book
        groups = {gid: [int(g.pid), str(g.status), int(g.stamp)] for gid, g in book.groups.items()}
        sampler = {
            "groups": groups,
            "next_pid": int(book.next_pid),
            "counts": {k: int(v) for k, v in book.counts.items()},
            "ghosts": int(book.ghosts),
        }
        checkpoint.save_state({"format": STATE_FORMAT, "core": self.core.state_dict(), "sampler": sampler}, path)
        # Earlier builds kept the map beside the core; this file holds both now, and a stale map must not linger.
        legacy = f"{path}{LEGACY_GROUPS_SUFFIX}"
        if os.path.exists(legacy):
            os.unlink(legacy)

    def _read_state(self, path: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """(the core's state_dict, the sampler's map, checked and converted: ``_map``) from ``path``: one file, or
        the two an earlier build wrote. Reads and checks only; changes nothing."""
        tree = checkpoint.load_state(path)
        if isinstance(tree, dict) and tree.get("format") == STATE_FORMAT:
            if "core" not in tree:
                raise checkpoint.CheckpointError(path, "has no 'core' entry: not a whole sampler state")
            return tree["core"], _map(path, tree.get("sampler"))
        legacy = f"{path}{LEGACY_GROUPS_SUFFIX}"
        if isinstance(tree, dict) and str(tree.get("format", "")).startswith("pyfast_buffer.state/"):
            # Earlier builds wrote the core here and the map beside it, in two writes; still read.
            if not os.path.exists(legacy):
                raise checkpoint.CheckpointError(
                    path,
                    f"holds only the buffer core; the group map an earlier build kept beside it ({legacy}) is "
                    "missing. Restore both files from the same save, or remove the state_path file to start fresh",
                )
            try:
                with open(legacy, encoding="utf-8") as f:
                    groups = json.load(f)
            except ValueError as exc:  # not JSON, or not UTF-8
                raise checkpoint.CheckpointError(legacy, f"is not a JSON group map ({exc}): damaged") from exc
            return tree, _map(legacy, groups)
        raise checkpoint.CheckpointError(
            path,
            f"is a pyfast_buffer checkpoint but not a NeMo RL sampler state ({STATE_FORMAT}); point state_path at the "
            "file StalenessSampler.save_state wrote",
        )

    def _load_state(self, path: str) -> None:
        """Restores the core and the map; attempts in flight at the save are failed (NeMo keeps only finished
        groups across a restart) and counted ``lost_in_resume``; restored groups NeMo no longer has are ghosts."""
        book = self.book
        core_state, state = self._read_state(path)  # the map is checked here: nothing below can refuse it
        failed = checkpoint.restore(self.core, core_state, in_flight="fail", path=path)  # refuses changing nothing
        book.next_pid, book.ghosts = state["next_pid"], state["ghosts"]
        book.counts.update(state["counts"])
        book.counts["lost_in_resume"] += len(failed)
        for gid, (pid, status, stamp) in state["groups"].items():
            if status == READY:
                book._add(gid, READY, stamp, pid)
        if len(failed):
            logger.warning("%d prompt-group attempts in flight at the save are lost in the resume", len(failed))
