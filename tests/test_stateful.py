"""Hypothesis drives the native buffer and its pure-Python twin with the same random calls.

After every call both must agree exactly: same batch, same metrics, same ledger, or the
same exception type; and the two ledger invariants must hold.

Leases run on a frozen lease clock (the private hook ``_set_lease_clock``) that a rule advances on
both buffers at once: which prompts expire is then a function of the calls alone, never of how long
the test machine took between them, so the comparison stays exact and the test cannot flake.
"""

from collections import Counter

import hypothesis.strategies as st
from _helpers import assert_balanced, rows
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import pyfast_buffer as pfb


class NativeMatchesReference(RuleBasedStateMachine):
    @initialize(
        capacity=st.integers(2, 10),
        max_age=st.integers(0, 4),
        strategy=st.sampled_from(["drop", "wait", "pace", "pace"]),
        max_uses=st.integers(1, 3),
        on_full=st.sampled_from(["evict_oldest", "error", "block"]),
        sync=st.sampled_from([None, 1, 2]),
        unique=st.booleans(),
        per_step=st.integers(1, 3),
        lookahead=st.sampled_from([None, 0, 1, 2]),
        age_from=st.sampled_from(["start", "finish"]),
        max_attempts=st.sampled_from([None, None, 1, 2, 3]),
    )
    def build(
        self, capacity, max_age, strategy, max_uses, on_full, sync, unique, per_step, lookahead, age_from, max_attempts
    ):
        pace = strategy == "pace"
        kwargs = dict(
            prompts_per_step=per_step if pace else None,
            lookahead=min(lookahead, max_age) if pace and lookahead is not None else None,
            age_from=age_from,
            capacity=capacity,
            max_age=max_age,
            strategy=strategy,
            max_uses=max_uses,
            on_full=on_full,
            parameter_sync_step=sync,
            track_released=True,
            unique_ids=unique,
            max_attempts=max_attempts,
        )
        self.native = pfb.StalenessBuffer(**kwargs)
        self.ref = pfb.ReferenceBuffer(**kwargs)
        self.next_traj = 0
        self.next_prompt = 0
        self.lease_clock = 0
        self.entered = Counter()  # trajectory ids that entered the ring (an id may come back after it left)
        self.released = Counter()  # trajectory ids reported released
        self.prompt_records = Counter()  # reason code -> prompt records (failed, expired)
        for buf in (self.native, self.ref):
            buf._set_lease_clock(0)

    def both(self, call):
        """Runs call on both buffers; returns the two results, or asserts both raised the same type."""
        outcome = []
        for buf in (self.native, self.ref):
            try:
                outcome.append(("ok", call(buf)))
            except (ValueError, TypeError, TimeoutError, pfb.BufferFullError) as exc:
                outcome.append(("error", type(exc)))
        assert outcome[0][0] == outcome[1][0], outcome
        if outcome[0][0] == "error":
            assert outcome[0][1] is outcome[1][1], outcome
            return None
        return outcome[0][1], outcome[1][1]

    @property
    def clock(self):
        return max(self.ref._clock, 0)

    def in_flight(self):
        return sorted(self.ref._in_flight)

    @rule(
        count=st.integers(1, 3),
        lag=st.integers(0, 3),
        reuse_old=st.booleans(),
        lease=st.sampled_from([None, None, 0.5, 1, 2.5]),
        timeout=st.sampled_from([None, None, 0]),
    )
    def dispatch(self, count, lag, reuse_old, lease, timeout):
        prompts = list(range(self.next_prompt, self.next_prompt + count))
        if reuse_old and self.next_prompt:
            prompts[0] = self.next_prompt - 1  # may still be in flight: then both must refuse
        self.next_prompt += count
        step = max(0, self.clock + 1 - lag)
        # Under pace a dispatch that does not fit is refused (timeout None) or times out at once (0) in both.
        self.both(lambda b: b.dispatch(prompts, step, lease=lease, timeout=timeout))

    @precondition(lambda self: self.next_prompt > 0)
    @rule(data=st.data(), lag=st.integers(0, 3), timeout=st.sampled_from([None, 0]))
    def dispatch_again(self, data, lag, timeout):
        """Dispatches earlier prompts again: after a lost attempt a retry, at max_attempts a protected attempt
        (under pace decided before admission, and counted in protected_admitted by both)."""
        count = data.draw(st.integers(1, min(3, self.next_prompt)))
        prompts = data.draw(st.lists(st.integers(0, self.next_prompt - 1), min_size=count, max_size=count, unique=True))
        step = max(0, self.clock + 1 - lag)
        self.both(lambda b: b.dispatch(prompts, step, timeout=timeout))

    @precondition(lambda self: self.ref.config.strategy == "pace")
    @rule(lag=st.integers(0, 3))
    def admissible(self, lag):
        step = max(0, self.clock + 1 - lag)
        result = self.both(lambda b: b.admissible(step))
        assert result is not None and result[0] == result[1]

    @rule(seconds=st.sampled_from([0.25, 0.5, 1, 2]))
    def advance_lease_clock(self, seconds):
        self.lease_clock += int(seconds * 1e9)
        for buf in (self.native, self.ref):
            buf._set_lease_clock(self.lease_clock)

    @rule(prompt=st.integers(0, 30), lease=st.sampled_from([0.5, 1, 3]))
    def renew(self, prompt, lease):
        self.both(lambda b: b.renew([prompt], lease))

    @rule(older_than=st.sampled_from([0, 0.5, 1, 3]))
    def expire_in_flight(self, older_than):
        result = self.both(lambda b: b.expire_in_flight(older_than))
        if result:
            assert result[0] == result[1]

    @rule(lag=st.integers(-1, 3))
    def restamp_in_flight(self, lag):
        """An in-flight weight update: both raise the same prompts (age_from='finish'), or both refuse ('start', or a
        step past the trainer's next step: pace's next take, else one past the largest step seen)."""
        step = max(0, self.clock + 1 - lag)
        ref = self.ref
        limit = ref._pace_next_take() if ref.config.strategy == "pace" else max(ref._clock, 0) + 1
        refused = ref.config.age_from == "start" or step > limit or ref.closed
        result = self.both(lambda b: b.restamp_in_flight(step))
        assert (result is None) == refused
        if result:
            assert result[0] == result[1]

    @precondition(lambda self: self.ref._in_flight)
    @rule(data=st.data())
    def complete(self, data):
        flying = self.in_flight()
        chosen = data.draw(st.lists(st.sampled_from(flying), min_size=1, max_size=3, unique=True))
        sizes = data.draw(st.lists(st.integers(1, 3), min_size=len(chosen), max_size=len(chosen)))
        prompts = [p for p, n in zip(chosen, sizes) for _ in range(n)]
        prompts = data.draw(st.permutations(prompts))
        trajs = list(range(self.next_traj, self.next_traj + len(prompts)))
        self.next_traj += len(prompts)
        # finish_step: none, one for all, or one per prompt plus a drawn offset (-1 is before dispatch: refused;
        # per trajectory it can split a group, which age_from='finish' refuses).
        how = data.draw(st.sampled_from(["none", "none", "one", "per_prompt", "per_trajectory"]))
        started = {p: self.ref._in_flight[p][0] for p in chosen}
        finish = None
        if how == "one":
            finish = max(started.values()) + data.draw(st.integers(-1, 2))
        elif how == "per_prompt":
            offset = {p: data.draw(st.integers(0, 2)) for p in chosen}
            finish = [started[p] + offset[p] for p in prompts]
        elif how == "per_trajectory":
            finish = [started[p] + data.draw(st.integers(-1, 2)) for p in prompts]
        if finish is not None and min(finish if isinstance(finish, list) else [finish]) < 0:
            finish = None
        if self.both(lambda b: b.complete(trajs, prompts, finish_step=finish)):
            self.entered.update(trajs)

    @rule(prompt=st.integers(0, 30))
    def fail(self, prompt):
        self.both(lambda b: b.fail([prompt]))

    @rule(
        n=st.integers(1, 4),
        lag=st.integers(0, 4),
        grouped=st.booleans(),
        per_entry=st.booleans(),
        reuse_old=st.booleans(),
    )
    def put(self, n, lag, grouped, per_entry, reuse_old):
        trajs = list(range(self.next_traj, self.next_traj + n))
        if reuse_old and self.next_traj:
            trajs[0] = self.next_traj - 1  # may still be ready: unique_ids=True must then refuse it in both
        self.next_traj += n
        step = max(0, self.clock + 1 - lag)
        groups = [t // 2 for t in trajs] if grouped else None
        stamps = [step] * n if per_entry else step
        finish = [step + t % 2 for t in trajs] if per_entry and lag % 2 else None
        if self.both(lambda b: b.put(trajs, stamps, group_ids=groups, finish_step=finish)):
            self.entered.update(trajs)

    @rule(
        batch_size=st.integers(1, 6),
        advance=st.integers(-1, 2),
        timeout=st.sampled_from([None, None, 0]),
        bounded=st.sampled_from([True, True, False]),
    )
    def take(self, batch_size, advance, timeout, bounded):
        step = max(0, self.clock + advance)
        max_age, changes = self.native.max_age, self.native.ledger()["max_age_changes"]
        result = self.both(lambda b: b.take(batch_size, step, timeout=timeout, bounded=bounded))
        # A take without the bound is that call's alone: the buffers' max_age never moves for it (issue 55).
        assert self.native.max_age == self.ref.max_age == max_age
        assert self.native.ledger()["max_age_changes"] == changes
        if result:
            native, ref = result
            assert rows(native) == rows(ref)
            assert native.finish_step.tolist() == ref.finish_step.tolist()
            assert native.metrics == ref.metrics
            if not bounded:
                assert native.metrics["buffer/dropped_stale"] == 0

    @rule(advance=st.integers(0, 3))
    def evict_stale(self, advance):
        result = self.both(lambda b: b.evict_stale(self.clock + advance))
        if result:
            assert result[0] == result[1]

    @rule(groups=st.integers(0, 3))
    def evict_oldest(self, groups):
        result = self.both(lambda b: b.evict_oldest(groups))
        if result:
            assert result[0] == result[1]

    @rule(max_age=st.integers(0, 5))
    def set_max_age(self, max_age):
        if self.both(lambda b: setattr(b, "max_age", max_age)) is not None:  # pace refuses max_age < lookahead
            assert self.native.max_age == self.ref.max_age == max_age

    @rule()
    def checkpoint_round_trip(self):
        sd = self.native.state_dict()
        assert {k: v.tolist() for k, v in sd["entries"].items() if "_ns" not in k} == {
            k: v.tolist() for k, v in self.ref.state_dict()["entries"].items() if "_ns" not in k
        }
        self.native.load_state_dict(sd)

    @invariant()
    def same_ledger_balanced_and_every_id_accounted(self):
        if not hasattr(self, "native"):
            return
        led = self.native.ledger()
        assert led == self.ref.ledger()
        assert len(self.native) == len(self.ref) and self.native.in_flight == self.ref.in_flight
        assert_balanced(self.native)
        assert_balanced(self.ref)
        # Every id reported once, in the same order by both; each trajectory that entered has left or is ready.
        native, ref = self.native.released(), self.ref.released()
        assert native.ids.tolist() == ref.ids.tolist() and native.reasons.tolist() == ref.reasons.tolist()
        for id_, code in zip(native.ids.tolist(), native.reasons.tolist()):
            if code <= 2:
                self.released[id_] += 1
            else:
                self.prompt_records[code] += 1
        ready = Counter(self.native.state_dict()["entries"]["traj_id"].tolist())
        assert self.released + ready == self.entered
        assert self.prompt_records[3] + self.prompt_records[4] == led["failed"]
        assert self.prompt_records[4] == led["expired"] and led["released_overflow"] == 0


NativeMatchesReference.TestCase.settings = settings(stateful_step_count=40)
TestNativeMatchesReference = NativeMatchesReference.TestCase
