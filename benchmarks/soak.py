"""Soak test (not part of CI): producers and a consumer hammer one buffer for a chosen time while the
process's resident memory and the ledger are reported at fixed intervals.

    python benchmarks/soak.py --seconds 600                   # ten minutes, native buffer, defaults below
    python benchmarks/soak.py --seconds 60 --impl reference --strategy wait --json soak.json
    python benchmarks/soak.py --seconds 600 --lease 0.5 --lost-rate 0.01 --track-released   # leases, released ids

A healthy run keeps RSS flat after the warm-up (the ring is allocated once; batches are freed when
dropped) and the ledger balanced at every report. Exit status 1 if the ledger ever fails to balance,
if a worker raised, if the consumer's count of taken trajectories differs from the ledger's, if (with
--track-released) the released-id records do not account for every trajectory and failed prompt exactly
as the ledger does, or if RSS grew by more than --max-rss-growth-mb after the warm-up (when given).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import pyfast_buffer as pfb

# Ledger keys printed in each report, in order.
LEDGER_KEYS = (
    "dispatched",
    "completed",
    "failed",
    "expired",
    "in_flight",
    "put_total",
    "taken",
    "retired",
    "dropped_stale",
    "evicted",
    "buffer_left",
)


def rss_mb() -> float:
    """Returns this process's resident set size now, in MiB (peak RSS where /proc is missing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def balanced(ledger: dict[str, int]) -> bool:
    """Returns True iff both ledger identities of DESIGN.md hold."""
    return (
        ledger["put_total"] == ledger["retired"] + ledger["dropped_stale"] + ledger["evicted"] + ledger["buffer_left"]
        and ledger["dispatched"] == ledger["completed"] + ledger["failed"] + ledger["in_flight"]
    )


@dataclass
class Report:
    """One line of the soak's time series."""

    seconds: float
    rss_mb: float
    ledger: dict[str, int]
    balanced: bool


@dataclass
class SoakResult:
    """Everything the soak measured; written as JSON with --json."""

    args: dict[str, Any]
    reports: list[Report] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    consumer_taken: int = 0
    checkpoints: int = 0
    released: dict[str, int] = field(default_factory=dict)  # records drained per reason, with --track-released


class Soak:
    """Runs the workers against one buffer until the deadline, recording a Report every interval."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.result = SoakResult(args=vars(args))
        impl = pfb.StalenessBuffer if args.impl == "native" else pfb.ReferenceBuffer
        self.buf = impl(
            args.capacity,
            max_age=args.max_age,
            strategy=args.strategy,
            max_uses=args.max_uses,
            on_full=args.on_full,
            track_released=args.track_released,
        )
        self.result.released = dict.fromkeys(pfb.RELEASE_REASONS, 0)
        self.shadow = impl(
            args.capacity, max_age=args.max_age, strategy=args.strategy, max_uses=args.max_uses, on_full=args.on_full
        )
        self.step = 0  # the trainer step; only the consumer advances it
        self.stop = threading.Event()
        self.lock = threading.Lock()  # guards result.errors

    def _record_error(self, who: str, exc: BaseException) -> None:
        with self.lock:
            self.result.errors.append(f"{who}: {type(exc).__name__}: {exc}")
        self.stop.set()

    def producer(self, k: int) -> None:
        rng = random.Random(k)
        args = self.args
        i = 0
        try:
            while not self.stop.is_set():
                base = (k + 1) << 40
                prompts = [base + i + j for j in range(args.prompts_per_call)]
                i += args.prompts_per_call
                self.buf.dispatch(prompts, self.step, lease=args.lease)
                failed = {p for p in prompts if rng.random() < args.fail_rate}
                # Lost prompts are never finished, as if their worker died: only a lease ends them.
                lost = {p for p in prompts if args.lease is not None and rng.random() < args.lost_rate}
                done = [p for p in prompts if p not in failed and p not in lost]
                if failed:
                    self.buf.fail(sorted(failed))
                if done:
                    trajs = [p * args.group_size + g for p in done for g in range(args.group_size)]
                    owners = [p for p in done for _ in range(args.group_size)]
                    try:
                        self.buf.complete(trajs, owners, timeout=1.0)
                    except TimeoutError:
                        self.buf.fail(done)  # on_full="block" and the consumer is slow: give them up
                    except ValueError:
                        if args.lease is None:
                            raise
                        # A lease passed while this producer was blocked: those prompts expired; finish the rest.
                        self._finish_live(done, args.group_size)
        except pfb.BufferClosedError:
            pass
        except Exception as exc:
            self._record_error(f"producer {k}", exc)

    def _finish_live(self, prompts: list[int], group_size: int) -> None:
        """Completes those of `prompts` still in flight one by one (the others expired meanwhile)."""
        for p in prompts:
            with contextlib.suppress(ValueError, TimeoutError):
                self.buf.complete([p * group_size + g for g in range(group_size)], [p] * group_size, timeout=1.0)

    def drain_released(self) -> None:
        """Counts the released-id records kept since the previous call, per reason."""
        rel = self.buf.released()
        for code, count in zip(*np.unique(rel.reasons, return_counts=True)):
            self.result.released[pfb.RELEASE_REASONS[int(code)]] += int(count)

    def consumer(self) -> None:
        taken = 0
        try:
            while not self.stop.is_set():
                try:
                    batch = self.buf.take(self.args.batch_size, self.step, timeout=0.5)
                except TimeoutError:
                    continue
                taken += len(batch)
                self.step += 1
                if self.args.track_released:
                    self.drain_released()
                if self.step % 16 == 0:
                    self.buf.evict_stale(self.step)
        except pfb.BufferClosedError:
            pass
        except Exception as exc:
            self._record_error("consumer", exc)
        finally:
            self.result.consumer_taken = taken

    def checkpointer(self) -> None:
        try:
            while not self.stop.wait(self.args.checkpoint_every):
                self.shadow.load_state_dict(self.buf.state_dict())
                self.result.checkpoints += 1
        except pfb.BufferClosedError:
            pass
        except Exception as exc:
            self._record_error("checkpointer", exc)

    def report(self, start: float) -> Report:
        ledger = self.buf.ledger()
        rep = Report(round(time.monotonic() - start, 1), round(rss_mb(), 1), ledger, balanced(ledger))
        self.result.reports.append(rep)
        cells = " ".join(f"{ledger.get(k, 0):>11}" for k in LEDGER_KEYS)
        print(f"{rep.seconds:>8.1f} {rep.rss_mb:>9.1f} {cells} {'yes' if rep.balanced else 'NO':>8}", flush=True)
        return rep

    def run(self) -> SoakResult:
        args = self.args
        workers = [threading.Thread(target=self.producer, args=(k,), daemon=True) for k in range(args.producers)]
        workers.append(threading.Thread(target=self.consumer, daemon=True))
        if args.checkpoint_every > 0:
            workers.append(threading.Thread(target=self.checkpointer, daemon=True))
        print(f"{'seconds':>8} {'rss_mb':>9} " + " ".join(f"{k:>11}" for k in LEDGER_KEYS) + f" {'balanced':>8}")
        start = time.monotonic()
        for t in workers:
            t.start()
        self.report(start)
        deadline = start + args.seconds
        while not self.stop.is_set() and time.monotonic() < deadline:
            self.stop.wait(min(args.report_every, max(0.0, deadline - time.monotonic())))
            self.report(start)
        self.stop.set()
        self.buf.close()  # wakes any blocked call with BufferClosedError
        for t in workers:
            t.join(30)
        if any(t.is_alive() for t in workers):
            self.result.errors.append("a worker did not stop within 30 s of close()")
        if args.track_released:
            self.drain_released()
        self.report(start)
        return self.result


def verdict(result: SoakResult, warmup: float, max_growth: float | None) -> list[str]:
    """Returns the reasons the soak failed (empty when it passed), after printing its summary."""
    problems = list(result.errors)
    reps = result.reports
    if not all(r.balanced for r in reps):
        problems.append("the ledger failed to balance at " + ", ".join(f"{r.seconds}s" for r in reps if not r.balanced))
    final = reps[-1].ledger
    if result.args["track_released"]:
        print(f"released-id records drained: {result.released}; overflow {final.get('released_overflow', 0)}")
    if result.released and result.args["track_released"] and final.get("released_overflow", 0) == 0:
        rel = result.released
        expected = {
            "retired": final["retired"],
            "dropped_stale": final["dropped_stale"],
            "evicted": final["evicted"],
            "failed": final["failed"] - final["expired"],
            "expired": final["expired"],
        }
        if rel != expected:
            problems.append(f"released-id records {rel} do not match the ledger {expected}")
    if result.consumer_taken != final["taken"]:
        problems.append(f"the consumer counted {result.consumer_taken} taken, the ledger {final['taken']}")
    after_warmup = [r for r in reps if r.seconds >= warmup] or reps[-1:]
    base = after_warmup[0].rss_mb
    peak = max(r.rss_mb for r in after_warmup)
    growth = after_warmup[-1].rss_mb - base
    print(
        f"\nRSS after the {warmup:g} s warm-up: {base:.1f} MiB, peak {peak:.1f}, end {after_warmup[-1].rss_mb:.1f} "
        f"(growth {growth:+.1f} MiB); {final['taken']} trajectories taken in {reps[-1].seconds:g} s "
        f"({final['taken'] / max(reps[-1].seconds, 1e-9):.0f}/s), {result.checkpoints} state_dict round trips"
    )
    if max_growth is not None and growth > max_growth:
        problems.append(f"RSS grew by {growth:.1f} MiB after the warm-up, more than --max-rss-growth-mb={max_growth}")
    return problems


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    p.add_argument("--report-every", type=float, default=5.0, help="seconds between reports (default 5)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds before RSS growth is measured (default 5)")
    p.add_argument("--impl", choices=("native", "reference"), default="native")
    p.add_argument("--producers", type=int, default=3)
    p.add_argument("--prompts-per-call", type=int, default=16)
    p.add_argument("--group-size", type=int, default=4, help="trajectories per prompt")
    p.add_argument("--fail-rate", type=float, default=0.05, help="fraction of prompts failed instead of completed")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--capacity", type=int, default=8192)
    p.add_argument("--max-age", type=int, default=4)
    p.add_argument("--strategy", choices=("drop", "wait"), default="drop")
    p.add_argument("--max-uses", type=int, default=1)
    p.add_argument("--on-full", choices=("evict_oldest", "block", "error"), default="evict_oldest")
    p.add_argument(
        "--checkpoint-every",
        type=float,
        default=2.0,
        help="seconds between state_dict -> load_state_dict round trips into a second buffer (0: none)",
    )
    p.add_argument("--lease", type=float, default=None, help="dispatch with this lease in seconds (default none)")
    p.add_argument(
        "--lost-rate",
        type=float,
        default=0.0,
        help="with --lease: fraction of prompts never finished, left for the lease to expire",
    )
    p.add_argument(
        "--track-released",
        action="store_true",
        help="drain released() after every batch and check the records against the ledger",
    )
    p.add_argument("--max-rss-growth-mb", type=float, default=None, help="fail if RSS grows more after the warm-up")
    p.add_argument("--json", default=None, help="also write the time series and verdict to this file")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.report_every <= 0:
        p.error("--seconds and --report-every must be > 0")
    if args.on_full == "error":
        p.error("--on-full error makes producers fail on every full ring; use evict_oldest or block")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"soak: {args.impl} buffer, pid {os.getpid()}, {args.seconds:g} s, {args.producers} producers")
    result = Soak(args).run()
    problems = verdict(result, args.warmup, args.max_rss_growth_mb)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({**asdict(result), "problems": problems}, out, indent=1)
    for problem in problems:
        print("FAILED:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
