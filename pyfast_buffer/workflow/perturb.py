"""``pyfast-buffer perturb``: prove the drop path runs by perturbing ``max_age``.

Step five of the staleness procedure (docs/workflow.md): run the same workload with a very
small and a very large ``max_age``; drops must rise sharply with the small one and fall
to about zero with the large one. When they do not move, the drop code is never called
(another consumption path, another buffer, or the ``wait`` strategy). ``perturb(run)`` is
the Python face; ``run`` receives a factory that builds the buffers of the workload.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import random
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Set

from .._args import MAX_CAPACITY
from ..buffer import StalenessBuffer
from .audit import ledger_gap
from .output import print_output
from .rhythm import REQUIRED_RATES

SMALL_MAX_AGE = 0
LARGE_MAX_AGE = 10**9
#: Drops with the large max_age count as "about zero" at or below this share of sampled_total.
ABOUT_ZERO = 0.01
#: Drops with the small max_age must be at least this many times those with the large one.
SHARP = 10
LEDGER_ROWS = ("sampled_total", "taken", "retired", "dropped_stale", "evicted", "buffer_left", "in_flight")
#: Largest max_age the buffer takes (int64).
MAX_AGE_LIMIT = 2**63 - 1
#: Most trajectories the built-in simulation makes (produced_per_step x steps), to stay a quick check.
MAX_SIMULATED_TRAJECTORIES = 10_000_000
#: Exit codes: drops moved cleanly / did not move / usage error / moved but not cleanly / inconclusive (nothing old
#: enough) / the workload raised (nothing was measured: told apart from 1, which is a finding about the drop path).
EXIT_MOVED, EXIT_NOT_MOVED, EXIT_USAGE, EXIT_NOT_CLEAN, EXIT_INCONCLUSIVE, EXIT_WORKLOAD_FAILED = 0, 1, 2, 3, 4, 5


class _PerturbError(ValueError):
    """perturb's own refusal (bad ages, or a workload that built no buffer), told apart from the workload's errors."""


class WorkloadError(RuntimeError):
    """The workload raised: nothing was measured. ``__cause__`` is its exception, ``max_age`` the run it broke."""

    def __init__(self, max_age: int, exc: BaseException) -> None:
        self.max_age = max_age
        first = _first_line(exc)
        where = _user_frame(exc)
        exited = "; it exited instead of returning" if isinstance(exc, SystemExit) else ""
        super().__init__(
            f"the workload raised {type(exc).__name__}"
            + (f": {first}" if first else "")
            + f" (in its max_age={max_age} run{', at ' + where if where else ''}){exited}; nothing was measured: "
            "fix the workload, or rerun with --traceback to see the whole trace"
        )


def _first_line(exc: BaseException) -> str:
    """The first line of ``str(exc)``, or a note naming what went wrong when its ``__str__`` raises."""
    try:
        text = str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException as failure:  # a broken __str__ must not hide the workload's exception
        return f"<its message could not be printed: str() raised {type(failure).__name__}>"
    return (text.strip().splitlines() or [""])[0]


def _user_frame(exc: BaseException) -> str:
    """file:line of the innermost frame outside this package (the workload's own line), or ""."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = traceback.extract_tb(exc.__traceback__)
    outside = [f for f in frames if not os.path.abspath(f.filename).startswith(package + os.sep)]
    if not outside:
        return ""
    name = os.path.relpath(outside[-1].filename) if os.path.isabs(outside[-1].filename) else outside[-1].filename
    if name.startswith(os.pardir):  # outside the working directory: the absolute path says more
        name = outside[-1].filename
    return f"{name}:{outside[-1].lineno}"


Factory = Callable[..., Any]
Workload = Callable[[Factory], Any]


@dataclass
class PerturbResult:
    """Both ledgers (summed over every buffer the workload built), the verdict and its exit code."""

    small_max_age: int
    large_max_age: int
    small: Dict[str, int]
    large: Dict[str, int]
    strategies: List[str]
    verdict: str
    moved: bool  # drops rose with the small max_age and fell to about zero with the large one
    exit_code: int  # 0 moved, 1 drops did not move at all, 3 they moved but not cleanly, 4 inconclusive


def perturb(
    run: Workload,
    small_max_age: int = SMALL_MAX_AGE,
    large_max_age: int = LARGE_MAX_AGE,
    buffer_class: type = StalenessBuffer,
) -> PerturbResult:
    """Runs ``run(factory)`` twice, forcing ``max_age`` to ``small_max_age`` then ``large_max_age``.

    ``factory(**kwargs)`` builds ``buffer_class(**kwargs)`` with ``max_age`` replaced; the
    workload may build several buffers and the ledgers are summed. Raises ValueError when
    the workload never calls the factory (nothing was measured) or the ages are not small < large,
    and WorkloadError (its exception chained) when the workload raises anything but KeyboardInterrupt
    (SystemExit and other BaseExceptions included: nothing was measured).
    """
    if not 0 <= small_max_age < large_max_age <= MAX_AGE_LIMIT:
        raise _PerturbError(
            f"small_max_age={small_max_age}, large_max_age={large_max_age}: need "
            f"0 <= small < large <= {MAX_AGE_LIMIT} (int64)"
        )
    ledgers: List[Dict[str, int]] = []
    strategies: Set[str] = set()
    for max_age in (small_max_age, large_max_age):
        built: List[Any] = []

        def factory(**kwargs: Any) -> Any:
            buf = buffer_class(**{**kwargs, "max_age": max_age})  # noqa: B023 - run() calls it in this iteration
            built.append(buf)  # noqa: B023 - same
            return buf

        try:
            run(factory)
        except KeyboardInterrupt:  # the user's Ctrl-C: not the workload's failure
            raise
        except BaseException as exc:  # the workload's own failure, SystemExit and other BaseExceptions included:
            # sys.exit(0) inside it would otherwise read as exit 0, "drops moved cleanly", with nothing measured
            raise WorkloadError(max_age, exc) from exc
        if not built:
            raise _PerturbError(
                "the workload never called the buffer factory; build its buffer with factory(capacity=..., ...)"
            )
        strategies.update(b.config.strategy for b in built if hasattr(b, "config"))
        ledgers.append(_sum_ledgers(b.ledger() for b in built))
    small, large = ledgers
    verdict, moved, code = _verdict(small, large, small_max_age, large_max_age, sorted(strategies))
    return PerturbResult(small_max_age, large_max_age, small, large, sorted(strategies), verdict, moved, code)


def _sum_ledgers(ledgers: Any) -> Dict[str, int]:
    total: Dict[str, int] = {}
    for led in ledgers:
        for k, v in led.items():
            total[k] = total.get(k, 0) + int(v)
    return total


def _verdict(small: Dict[str, int], large: Dict[str, int], lo: int, hi: int, strategies: List[str]):
    ds, dl = small.get("dropped_stale", 0), large.get("dropped_stale", 0)
    if ds == dl == 0 and small.get("taken", 0) > 0 and strategies != ["wait"]:
        # The trainer does take from this buffer, but nothing it took was older than the small max_age:
        # the drop path had nothing to drop, so this run cannot show whether it works.
        fix = (
            f"run again with --small {lo - 1} or lower"
            if lo > 0
            else "every trajectory is taken in the step it was sampled (age 0), so no max_age can drop it; "
            "let the workload take trajectories a step or more after their sample step (as a real async run does)"
        )
        return (
            (
                f"inconclusive: taken={small.get('taken', 0)} with max_age={lo} and nothing was dropped, so no "
                f"trajectory taken was older than {lo}; {fix}"
            ),
            False,
            EXIT_INCONCLUSIVE,
        )
    if ds == dl:
        hint = (
            " (strategy 'wait' never drops for staleness)"
            if strategies == ["wait"]
            else "; the drop code is never called: check that the trainer takes from this buffer with strategy 'drop'"
        )
        return (
            f"drops do not move: dropped_stale={ds} with max_age={lo} and with max_age={hi}{hint}",
            False,
            EXIT_NOT_MOVED,
        )
    # Exactly the two conditions the messages state, and nothing else: any drop with the small max_age that the
    # large one does not repeat shows the drop code runs (there is no minimum count).
    limit = ABOUT_ZERO * large.get("sampled_total", 0)
    about_zero = dl <= limit
    sharp = ds >= SHARP * dl
    want = (
        f"the drops with max_age={lo} >= {SHARP}x those with max_age={hi} ({ds} vs {SHARP} x {dl} = {SHARP * dl}), "
        f"and those with max_age={hi} <= {ABOUT_ZERO:.0%} of its sampled_total ({dl} vs {limit:g})"
    )
    if about_zero and sharp:
        share = ds / max(1, small.get("sampled_total", 0))
        return (
            f"drop path runs: dropped_stale={ds} ({share:.1%} of sampled) with max_age={lo}, {dl} with "
            f"max_age={hi}; both hold: {want}",
            True,
            EXIT_MOVED,
        )
    failed = " and ".join(
        what
        for what, ok in ((f"not {SHARP}x", sharp), (f"not <= {ABOUT_ZERO:.0%} with the large one", about_zero))
        if not ok
    )
    return (
        f"drops moved but not cleanly ({failed}): dropped_stale={ds} with max_age={lo}, {dl} with max_age={hi}; "
        f"want {want}",
        False,
        EXIT_NOT_CLEAN,
    )


def simulated_workload(
    produced_per_step: int,
    consumed_per_step: int,
    capacity: int,
    parameter_sync_step: int = 1,
    steps: int = 200,
    seed: int = 0,
    max_latency: int = 4,
) -> Workload:
    """Returns a seeded producer/consumer workload for ``perturb``.

    Each trainer step produces ``produced_per_step`` trajectories with the weights of the last
    push, each finishing 1..``max_latency`` steps later (so every age is >= 1), and takes
    ``consumed_per_step``. The schedule depends only on the seed, so both runs see the same one.
    """
    for name, value in (
        ("produced_per_step", produced_per_step),
        ("consumed_per_step", consumed_per_step),
        ("capacity", capacity),
        ("parameter_sync_step", parameter_sync_step),
        ("steps", steps),
        ("max_latency", max_latency),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    if capacity > MAX_CAPACITY:
        raise ValueError(f"capacity={capacity} is above the buffer's largest, {MAX_CAPACITY}")
    if produced_per_step * steps > MAX_SIMULATED_TRAJECTORIES:
        raise ValueError(
            f"produced_per_step {produced_per_step} x steps {steps} is too large to simulate (at most "
            f"{MAX_SIMULATED_TRAJECTORIES} trajectories); lower --produced or --steps"
        )

    def workload(factory: Factory) -> None:
        rng = random.Random(seed)
        buf = factory(capacity=capacity, strategy="drop", parameter_sync_step=parameter_sync_step)
        finishing: Dict[int, List[int]] = {}  # step -> sample steps of trajectories finishing then
        next_id = 0
        for step in range(steps):
            weights = step - step % parameter_sync_step
            for _ in range(produced_per_step):
                finishing.setdefault(step + rng.randint(1, max_latency), []).append(weights)
            done = finishing.pop(step, [])
            if done:
                buf.put(list(range(next_id, next_id + len(done))), done)
                next_id += len(done)
            buf.take(consumed_per_step, step)

    return workload


def load_workload(spec: str) -> Workload:
    """Returns the function named by ``module:function`` or ``path/to/file.py:function``; raises ValueError."""
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"--workload {spec!r} is not module:function; write e.g. my_pkg.train:workload")
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise ValueError(f"--workload {spec!r}: no file {module_name}")
            loaded = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            if loaded is None or loaded.loader is None:
                raise ValueError(f"--workload {spec!r}: {module_name} cannot be loaded as a Python module")
            module = importlib.util.module_from_spec(loaded)
            loader: Any = loaded.loader  # typeshed's Loader types lack exec_module before 3.10 on some checkers
            loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ValueError:
        raise
    except ImportError as exc:
        raise ValueError(f"--workload {spec!r}: cannot import {module_name} ({exc}); check PYTHONPATH") from None
    except Exception as exc:
        raise ValueError(f"--workload {spec!r}: importing {module_name} failed ({type(exc).__name__}: {exc})") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"--workload {spec!r}: {module_name} has no function {func_name}")
    return func


def read_rhythm(path: str) -> Dict[str, Any]:
    """Returns the ``rhythm`` values of a ``rhythm --json`` file; raises ValueError saying what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--rhythm {path}: not the JSON of `pyfast-buffer rhythm --json` ({exc})") from None
    values = report.get("rhythm") if isinstance(report, dict) else None
    if not isinstance(values, dict):
        raise ValueError(f'--rhythm {path}: not the JSON of `pyfast-buffer rhythm --json` (no "rhythm" object)')
    return values


def rates_from_rhythm(path: str) -> Dict[str, int]:
    """Returns the simulation rates from a ``rhythm --json`` file; raises ValueError naming what is missing or bad."""
    values = read_rhythm(path)
    missing = [k for k in REQUIRED_RATES if values.get(k) is None]
    if missing:
        raise ValueError(f"--rhythm {path}: missing {', '.join(missing)}; rerun rhythm with --set {missing[0]}=N")
    for key in (*REQUIRED_RATES, "parameter_sync_step"):
        value = values.get(key)
        if value is None and key == "parameter_sync_step":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"--rhythm {path}: {key}={value!r} is not a finite number > 0; rerun rhythm with --set {key}=N"
            )
    rates = {k: max(1, round(values[k])) for k in REQUIRED_RATES}
    rates["parameter_sync_step"] = max(1, round(values.get("parameter_sync_step") or 1))
    return rates


def format_result(result: PerturbResult, title: str) -> str:
    """Returns both ledgers side by side and the verdict."""
    a, b = f"max_age={result.small_max_age}", f"max_age={result.large_max_age}"
    width = max(len(a), len(b), 12)
    out = [title, f"{'ledger':<15} {a:>{width}} {b:>{width}}"]
    for row in LEDGER_ROWS:
        out.append(f"{row:<15} {result.small.get(row, 0):>{width}} {result.large.get(row, 0):>{width}}")
    shares = [led.get("dropped_stale", 0) / max(1, led.get("sampled_total", 0)) for led in (result.small, result.large)]
    out.append(f"{'drop share':<15} {shares[0]:>{width}.1%} {shares[1]:>{width}.1%}")
    bal = [_balanced(led) for led in (result.small, result.large)]
    out.append(f"{'balanced':<15} {bal[0]!s:>{width}} {bal[1]!s:>{width}}")
    out.append(f"verdict: {result.verdict}")
    return "\n".join(out)


def _balanced(led: Dict[str, int]) -> bool:
    return (
        ledger_gap(
            led.get("sampled_total", 0),
            led.get("retired", 0),
            led.get("dropped_stale", 0),
            led.get("evicted", 0),
            led.get("buffer_left", 0),
        )
        == 0
    )


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.small < args.large <= MAX_AGE_LIMIT:
        print(
            f"perturb: --small {args.small} and --large {args.large}: need 0 <= small < large <= {MAX_AGE_LIMIT}"
            " (int64)",
            file=sys.stderr,
        )
        return 2
    try:
        workload, title = _workload_from_args(args)
    except ValueError as exc:
        print(f"perturb: {exc}", file=sys.stderr)
        return 2
    try:
        result = perturb(workload, args.small, args.large)
    except _PerturbError as exc:
        print(f"perturb: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WorkloadError as exc:
        # One line by default: the workload's failure is not perturb's, and 1 would read as "drops do not move".
        if args.traceback and exc.__cause__ is not None:
            traceback.print_exception(type(exc.__cause__), exc.__cause__, exc.__cause__.__traceback__)
        print(f"perturb: {exc}", file=sys.stderr)
        return EXIT_WORKLOAD_FAILED
    print_output(format_result(result, title))
    return result.exit_code


def _workload_from_args(args: argparse.Namespace):
    if args.workload:
        return load_workload(args.workload), f"perturb: workload {args.workload}"
    rates = {k: getattr(args, flag) for k, flag in _FLAG.items()}
    ignored = ""
    if args.rhythm:  # flags given explicitly win over the rhythm file
        rates.update({k: v for k, v in rates_from_rhythm(args.rhythm).items() if rates[k] is None})
        values = read_rhythm(args.rhythm)
        kept = [f"{k} {values[k]!r}" for k in ("strategy", "max_age") if values.get(k) is not None]
        if kept:
            ignored = (
                f"\nnote: the rhythm's {' and '.join(kept)} {'are' if len(kept) > 1 else 'is'} not used: "
                f"perturb forces max_age to --small and "
                "--large, and the simulation takes with strategy 'drop' (under 'wait' nothing is dropped)"
            )
    rates = {k: (v if v is not None else _DEFAULTS[k]) for k, v in rates.items()}
    workload = simulated_workload(**rates, steps=args.steps, seed=args.seed)
    title = (
        "perturb: built-in simulation, "
        + ", ".join(f"{k} {v}" for k, v in rates.items())
        + f", {args.steps} steps, seed {args.seed}"
        + ignored
    )
    return workload, title


_FLAG = {
    "produced_per_step": "produced",
    "consumed_per_step": "consumed",
    "capacity": "capacity",
    "parameter_sync_step": "sync",
}
_DEFAULTS = {"produced_per_step": 64, "consumed_per_step": 64, "capacity": 512, "parameter_sync_step": 1}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "perturb",
        help="run a workload with a tiny and a huge max_age and check that drops move",
        epilog=f"exit status: 0 drops moved cleanly: those with the small max_age are >= {SHARP}x those with "
        f"the large one, which are <= {ABOUT_ZERO:.0%} of its sampled_total; 1 they did not move (the drop path "
        "never runs); 2 usage error; 3 they moved but not cleanly; 4 inconclusive: trajectories were taken but "
        "none was older than the small max_age, so nothing could be dropped; 5 the workload raised (nothing was "
        "measured)",
    )
    src = p.add_argument_group("workload (a user function, or the built-in simulation)")
    src.add_argument(
        "--workload",
        metavar="MODULE:FUNCTION",
        help="function(factory) to run; factory(**kwargs) builds a StalenessBuffer with max_age forced",
    )
    src.add_argument("--rhythm", metavar="FILE", help="rates from the JSON of `pyfast-buffer rhythm --json`")
    src.add_argument(
        "--produced", type=int, help=f"trajectories produced per step (default {_DEFAULTS['produced_per_step']})"
    )
    src.add_argument(
        "--consumed", type=int, help=f"trajectories taken per step (default {_DEFAULTS['consumed_per_step']})"
    )
    src.add_argument("--capacity", type=int, help=f"buffer capacity (default {_DEFAULTS['capacity']})")
    src.add_argument("--sync", type=int, help="parameter_sync_step (default 1)")
    p.add_argument("--steps", type=int, default=200, help="simulated trainer steps (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--small", type=int, default=SMALL_MAX_AGE, help=f"the very small max_age (default {SMALL_MAX_AGE})")
    p.add_argument("--large", type=int, default=LARGE_MAX_AGE, help=f"the very large max_age (default {LARGE_MAX_AGE})")
    p.add_argument(
        "--traceback", action="store_true", help="when the workload raises, print its whole traceback (exit 5 still)"
    )
    p.set_defaults(run=run)
