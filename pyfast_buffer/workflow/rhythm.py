"""``pyfast-buffer rhythm``: the produce / store / consume rhythm read from config files.

Step one of the staleness procedure (docs/workflow.md): find the keys that set how fast
trajectories are produced, how many the buffer holds and how fast the trainer consumes
them, then work out how many steps one full turnover takes, how old trajectories get
under FIFO, and what ``max_age`` fits. ``scan(paths)`` and ``plan(...)`` are the Python faces.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..verl_mapping import max_age_from_threshold
from ._config_files import find_config_files, read_config
from ._known_keys import GENERIC_CAPACITY, match_keyword, match_known
from .output import print_output
from .plan import Plan as Plan
from .plan import finite_number, plan
from .verl_sources import VerlRun, read_verl_run

#: Names ``--set`` accepts for the rhythm itself (anything else is a dotted config key).
RHYTHM_KEYS = (
    "produced_per_step",
    "consumed_per_step",
    "capacity",
    "parameter_sync_step",
    "max_age",
    "strategy",
    "latency_steps",
    "runs_ahead",
)
#: The rates a plan needs (rhythm's ``missing`` and perturb's ``--rhythm`` both check these).
REQUIRED_RATES = ("produced_per_step", "consumed_per_step", "capacity")


@dataclass(frozen=True)
class Finding:
    """A config key that sets the rhythm: where it is written, its value, class and source."""

    path: str
    line: int
    key: str
    value: Any
    cls: str  # production / capacity / consumption / staleness
    source: str  # verl / AReaL / TRL, or "keyword" for the procedure's grep patterns
    role: str = ""  # what derive_rhythm reads it as ("" = shown only)
    meaning: str = ""


@dataclass
class ScanResult:
    """What ``scan`` found: the rhythm keys, the files read and the files skipped with a reason."""

    findings: List[Finding] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    skipped: List[Tuple[str, str]] = field(default_factory=list)


def scan(paths: List[str]) -> ScanResult:
    """Reads the config files at ``paths`` (directories recursively) and returns the rhythm keys in them.

    Never raises on bad files: each unreadable file is listed in ``skipped`` with its reason.
    Known keys of verl, AReaL and TRL carry a role; other numeric keys matching the
    procedure's grep patterns are classified by keyword.
    """
    files, skipped = find_config_files([str(p) for p in paths])
    result = ScanResult(skipped=skipped)
    for path in files:
        entries, reason = read_config(path)
        if reason:
            result.skipped.append((path, reason))
            continue
        result.files.append(path)
        for e in entries:
            finding = classify(e.path, e.line, e.key, e.value)
            if finding is not None:
                result.findings.append(finding)
    return result


def classify(path: str, line: int, key: str, value: Any) -> Optional[Finding]:
    """Returns the Finding for one config leaf, or None when it does not touch the rhythm."""
    known = match_known(key)
    if known is not None:
        return Finding(path, line, key, value, known.cls, known.source, known.role, known.meaning)
    cls = match_keyword(key, value)
    if cls is not None:
        role = "capacity" if GENERIC_CAPACITY.match(key.rsplit(".", 1)[-1]) else ""
        return Finding(path, line, key, value, cls, "keyword", role)
    return None


# ---------------------------------------------------------------- deriving the rhythm


def derive_rhythm(findings: List[Finding], notes: Optional[List[str]] = None) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Returns ({rhythm key: value}, {rhythm key: how it was derived}) from the findings.

    The first framework with enough keys wins (verl, then AReaL, then TRL); a generic
    capacity key fills a missing capacity. The first finding of a role wins; when another
    finding gives the same role a different value, a line saying so is appended to ``notes``.
    """
    roles: Dict[str, Finding] = {}
    # verl's fully-async recipe (async_training.*) runs its own trainer: the trainer.v1 block does not apply.
    fully_async = any(f.role == "verl.require_batches" for f in findings)
    for f in findings:
        if not f.role or (fully_async and f.key.startswith("trainer.v1.")):
            continue
        first = roles.setdefault(f.role, f)
        if first is not f and first.value != f.value and notes is not None:
            notes.append(
                f"{f.key}={f.value} ({f.path}:{f.line}) differs from {first.key}={first.value} "
                f"({first.path}:{first.line}); using the first: scan one run's configs, or --set the value"
            )
    values: Dict[str, Any] = {}
    how: Dict[str, str] = {}

    unusable: set = set()

    def num(role: str) -> Optional[float]:
        if role not in roles:
            return None
        f = roles[role]
        value = finite_number(f.value)
        if value is None and f.value is not None and role not in unusable and notes is not None:
            unusable.add(role)
            notes.append(
                f"{f.key}={_show(f.value)} ({f.path}:{f.line}) is not a finite number; ignored "
                f"(write a number, or --set {f.key}=N)"
            )
        return value

    def put(key: str, value: Any, text: str) -> None:
        if value is not None and key not in values:
            values[key] = int(value) if isinstance(value, float) and value.is_integer() else value
            how[key] = text

    def ref(role: str) -> str:
        f = roles[role]
        return f"{f.key}={f.value} ({f.path}:{f.line})"

    mode = roles["verl.trainer_mode"].value if "verl.trainer_mode" in roles else None
    if mode in ("sync", "colocate_async"):
        put(
            "parameter_sync_step",
            1,
            f"1: {ref('verl.trainer_mode')} pushes the weights every step"
            + (
                " (separate_async.parameter_sync_step applies to separate_async only)"
                if "parameter_sync_step" in roles
                else ""
            ),
        )
    warmup = f"verl.warmup.{mode}"
    if mode in ("colocate_async", "separate_async") and num(warmup):
        put("latency_steps", num(warmup), f"{ref(warmup)}: generation runs that many batches ahead of the trainer")
    sync = values.get("parameter_sync_step", num("parameter_sync_step"))
    if sync is not None and "parameter_sync_step" not in values:  # set by the trainer mode already
        put("parameter_sync_step", sync, ref("parameter_sync_step"))
    if "strategy" in roles and roles["strategy"].value == "pace" and notes is not None:
        notes.append(
            f"{ref('strategy')}: rhythm's planner models drop and wait only; under pace (PacedAgentLoopManager) "
            "prompts wait for admission and nothing is trained past max_age (docs/verl.md)"
        )
    if "strategy" in roles and roles["strategy"].value in ("drop", "wait"):
        put("strategy", roles["strategy"].value, ref("strategy"))
    _derive_verl(roles, num, put, ref, sync, notes, values, how)
    _derive_areal(roles, num, put, ref)
    _derive_trl(roles, num, put, ref)
    cap = num("capacity")
    if cap is not None:
        put("capacity", cap, ref("capacity"))
    return values, how


def _derive_verl(roles, num, put, ref, sync, notes, values, how) -> None:
    prompts, n = num("verl.prompts_per_step"), num("verl.samples_per_prompt")
    n_text = ref("verl.samples_per_prompt") if n is not None else "rollout.n=1 (verl's default)"
    n = n if n is not None else 1
    mini, require = num("verl.mini_batch_prompts"), num("verl.require_batches")
    if require is not None and mini is not None:  # fully async: the trainer pulls require_batches mini-batches a step
        per_step = mini * require * n
        text = f"{ref('verl.mini_batch_prompts')} x {ref('verl.require_batches')} x {n_text}"
        put("consumed_per_step", per_step, text)
        put("produced_per_step", per_step, text + "; the rollouter streams as fast as the trainer allows")
        put("runs_ahead", True, "verl's fully-async rollouter generates until the queue bound stops it")
        queue = num("verl.max_queue_size")
        if queue is not None:
            put("capacity", queue * n, f"{ref('verl.max_queue_size')} x {n_text}")
        else:
            stale = num("verl.staleness_threshold") or 0
            windows = (stale + 1) * (sync or 1)
            put(
                "capacity",
                math.ceil(per_step * windows),
                f"consumed_per_step x (staleness_threshold {stale} + 1) x trigger_parameter_sync_step {sync or 1}"
                " (verl's queue bound)",
            )
    elif prompts is not None:
        text = f"{ref('verl.prompts_per_step')} x {n_text}"
        put("produced_per_step", prompts * n, text)
        put("consumed_per_step", prompts * n, text + "; the trainer takes train_batch_size prompts a step")
    threshold = num("verl.threshold")
    if threshold is None and "verl.threshold" in roles and roles["verl.threshold"].value is None and notes is not None:
        notes.append(
            f"{ref('verl.threshold')}: null turns verl's staleness control off (verl 0.9.1): nothing is dropped "
            "or awaited for age, so no max_age is derived"
        )
    if threshold is not None:
        try:
            max_age = max_age_from_threshold(_as_int(threshold))
        except (TypeError, ValueError) as exc:
            if notes is not None:
                notes.append(f"{ref('verl.threshold')}: no max_age derived ({exc})")
        else:
            put("max_age", max_age, f"{ref('verl.threshold')} - 1 (verl's cutoff: global_steps - step + 1 > threshold)")
    verl = any(r.startswith("verl.") for r in roles)
    if "capacity" not in roles and "capacity" not in values and verl and prompts is not None and require is None:
        values["capacity"] = None  # put() keeps only values; None is the answer here: no bound
        how["capacity"] = (
            "none: verl's replay buffer has no capacity bound (sampler_kwargs.capacity is not set), and the "
            "trainer consumes what the rollout generated"
        )


def _as_int(value: Any) -> Any:
    """Returns an integer-valued float as an int (JSON's 2.0); anything else unchanged, for as_count to judge."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _derive_areal(roles, num, put, ref) -> None:
    n = num("areal.n_samples")
    n_text = ref("areal.n_samples") if n is not None else "n_samples=1"
    n = n if n is not None else 1
    prompts, consumer = num("areal.prompts_per_step"), num("areal.consumer_batch_size")
    if prompts is not None:
        put("produced_per_step", prompts * n, f"{ref('areal.prompts_per_step')} x {n_text}")
    if consumer is not None:
        put("consumed_per_step", consumer * n, f"{ref('areal.consumer_batch_size')} x {n_text}")
    elif prompts is not None:
        put(
            "consumed_per_step",
            prompts * n,
            f"{ref('areal.prompts_per_step')} x {n_text} (consumer_batch_size = batch size)",
        )
    head = num("areal.max_head_offpolicyness")
    if head is not None:
        put("max_age", head, ref("areal.max_head_offpolicyness") + " (one policy version per trainer step)")
        put("parameter_sync_step", 1, "1 (AReaL pushes weights after every step)")
        put("runs_ahead", True, "AReaL's rollout generates until max_head_offpolicyness stops it")
        queue = num("areal.queue_size")
        if queue is not None:
            put("capacity", queue * n, f"{ref('areal.queue_size')} x {n_text}")
        elif consumer is not None or prompts is not None:
            base = consumer if consumer is not None else prompts
            assert base is not None  # the elif: one of them is set
            per_step = base * n
            put(
                "capacity",
                (head + 1) * per_step,
                f"(max_head_offpolicyness {head:g} + 1) x consumed_per_step (AReaL's staleness capacity)",
            )


def _derive_trl(roles, num, put, ref) -> None:
    batch = num("trl.per_device_train_batch_size")
    if batch is None and "trl.num_iterations" not in roles and "trl.steps_per_generation" not in roles:
        return
    batch = batch if batch is not None else 8
    accum = num("trl.gradient_accumulation_steps") or 1
    per_gen = num("trl.steps_per_generation") or accum
    iters = num("trl.num_iterations") or 1
    per_step = batch * accum / iters  # fresh completions one optimiser step retires, per device
    text = (
        f"per_device_train_batch_size {batch:g} x gradient_accumulation_steps {accum:g} / num_iterations {iters:g}"
        " (per device)"
    )
    put("produced_per_step", per_step, text)
    put("consumed_per_step", per_step, text)
    put(
        "capacity",
        batch * per_gen,
        f"per_device_train_batch_size {batch:g} x steps_per_generation {per_gen:g} (one generation)",
    )
    put(
        "max_age",
        max(0, math.ceil(per_gen * iters / accum) - 1),
        f"ceil(steps_per_generation {per_gen:g} x num_iterations {iters:g}"
        f" / gradient_accumulation_steps {accum:g}) - 1",
    )
    put("parameter_sync_step", 1, "1 (TRL generates with the current weights)")


# ---------------------------------------------------------------- the command


def parse_set(items: List[str]) -> Dict[str, Any]:
    """Parses ``--set key=value`` items; raises ValueError naming a bad item.

    A value is an int if int() reads it, else a float if float() does (so 1e4 is a number, not YAML 1.1's
    string), else true/false/null, else the text itself.
    """
    out: Dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set {item!r} is not key=value; write e.g. --set capacity=4096")
        key, value = key.strip(), _scalar(text.strip())
        if key in RHYTHM_KEYS:
            _check_rhythm_value(key, value)
        out[key] = value
    return out


#: What each rhythm key of ``--set`` must be: (whole number?, smallest value, whether the smallest is allowed).
_RHYTHM_VALUE_RULES: Dict[str, Tuple[bool, float, bool]] = {
    "produced_per_step": (False, 0, False),
    "consumed_per_step": (False, 0, False),
    "capacity": (True, 1, True),
    "parameter_sync_step": (True, 1, True),
    "max_age": (True, 0, True),
    "latency_steps": (True, 0, True),
}


def _check_rhythm_value(key: str, value: Any) -> None:
    """Raises ValueError when ``--set key=value`` gives a rhythm key a value it cannot have.

    ``max_age`` and ``strategy`` may be null (not configured), ``capacity`` null (no bound); ``runs_ahead`` is
    true or false; the rates and counts must be numbers.
    """
    if value is None and key in ("max_age", "strategy", "capacity"):
        return
    if key == "runs_ahead":
        if not isinstance(value, bool):
            raise ValueError(f"--set runs_ahead={value!r} is not true or false; write --set runs_ahead=true")
        return
    if key == "strategy":
        if value not in ("drop", "wait"):
            raise ValueError(f"--set strategy={value!r} is unknown; write --set strategy=drop or --set strategy=wait")
        return
    whole, minimum, inclusive = _RHYTHM_VALUE_RULES[key]
    kind = "a whole number" if whole else "a number"
    bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
    example = "8" if whole else "64"
    number = finite_number(value)  # None for text, booleans, NaN and infinities
    if number is None or (whole and number != int(number)):
        raise ValueError(f"--set {key}={value!r} is not {kind}; write {kind} {bound}, e.g. --set {key}={example}")
    if number < minimum or (number == minimum and not inclusive):
        raise ValueError(f"--set {key}={value!r} must be {bound}; e.g. --set {key}={example}")


def _scalar(text: str) -> Any:
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"": None, "null": None, "none": None, "true": True, "false": False}.get(text.lower(), text)


def scan_verl_run(run: VerlRun) -> ScanResult:
    """The findings of one verl run's composed config and launch-script overrides (verl_sources)."""
    result = ScanResult(files=list(run.files))
    for e in run.entries:
        finding = classify(e.path, e.line, e.key, e.value)
        if finding is not None:
            result.findings.append(finding)
    return result


def decides(finding: Dict[str, Any], framework_found: bool) -> bool:
    """A row shown by default: a framework key from the known-keys table that the rhythm reads (a role), or,
    for a config of no known framework, a generic capacity key. The rest is shown with ``--all``."""
    if finding["source"] == "keyword":
        return bool(finding["role"]) and not framework_found
    return bool(finding["role"])


def analyse(
    paths: List[str],
    overrides: Optional[Dict[str, Any]] = None,
    base: Optional[str] = None,
    config_name: Optional[str] = None,
) -> Dict[str, Any]:
    """Runs scan (or, for a verl launch script or config folder, reads that run), applies ``overrides``
    (rhythm keys or dotted config keys) and plans where it can.

    Returns the JSON-able report that ``rhythm --json`` prints. Raises LaunchScriptError or
    RhythmInputError (ValueErrors) when a script or folder cannot be read as one verl run.
    """
    overrides = overrides or {}
    run = read_verl_run([str(p) for p in paths], base, config_name)
    result = scan_verl_run(run) if run is not None else scan(paths)
    for key, value in overrides.items():
        if key not in RHYTHM_KEYS:  # a dotted config key: override or add it
            result.findings = [f for f in result.findings if f.key != key]
            finding = classify("--set", 0, key, value) or Finding("--set", 0, key, value, "staleness", "--set")
            result.findings.insert(0, finding)
    notes: List[str] = list(run.notes) if run is not None else []
    values, how = derive_rhythm(result.findings, notes)
    for key in RHYTHM_KEYS:
        if key in overrides:
            values[key], how[key] = overrides[key], f"--set {key}={overrides[key]}"
    report: Dict[str, Any] = {
        "files": result.files,
        "skipped": [{"path": p, "reason": r} for p, r in result.skipped],
        "findings": [asdict(f) for f in result.findings],
        "config": run.config if run is not None else "",
        "rhythm": values,
        "derived_from": how,
        "plan": None,
        "missing": [k for k in REQUIRED_RATES if k not in values],
        "notes": notes,
    }
    framework = any(f["source"] != "keyword" for f in report["findings"])
    for f in report["findings"]:
        f["decides"] = decides(f, framework)
    if not report["missing"]:
        try:
            p = plan(
                values["produced_per_step"],
                values["consumed_per_step"],
                values["capacity"],
                values.get("parameter_sync_step", 1),
                max_age=values.get("max_age"),
                strategy=values.get("strategy"),
                latency_steps=values.get("latency_steps", 0),
                runs_ahead=bool(values.get("runs_ahead", False)),
            )
            report["plan"] = asdict(p)
        except ValueError as exc:
            report["plan_error"] = str(exc)
    return report


def format_report(report: Dict[str, Any], show_all: bool = False) -> str:
    """Returns the human-readable report of ``analyse``: the figure to act on first, then the keys that decide
    the rhythm (every matched key with ``show_all``), the derivation, the distribution and the warnings."""
    out = [f"rhythm: {len(report['files'])} file(s) read, {len(report['skipped'])} skipped"]
    p = report["plan"]
    if p:
        out.append(f"=> {p['headline']}")
    shown = [f for f in report["findings"] if show_all or f.get("decides", True)]
    hidden = len(report["findings"]) - len(shown)
    rows = [(f"{f['path']}:{f['line']}", f["key"], _show(f["value"]), f["cls"], f["source"]) for f in shown]
    if rows:
        head = ("file:line", "key", "value", "class", "source")
        widths = [max(len(r[i]) for r in [*rows, head]) for i in range(5)]
        out.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if hidden:
        out.append(f"({hidden} more matched key(s) do not decide the rhythm: --all lists them)")
    if not rows and not hidden:
        out.append(
            "no rhythm keys found (patterns: replay|buffer|queue|maxlen|capacity|pool, "
            "rollout|sample_batch|n_samples|batch_size|group_size, train_|update_|steps_per|interval|ratio|reuse)"
        )
    values, how = report["rhythm"], report["derived_from"]
    if values:
        out.append("")
        out.append("rhythm (trajectories per trainer step):")
        for key in RHYTHM_KEYS:
            if key in values:
                text = "none" if values[key] is None else _show(values[key])
                out.append(f"  {key:<20} {text:<8} = {how[key]}")
    if p and p["steady"]:
        dist = ", ".join(f"age {a}: {s:.0%}" for a, s in list(p["age_distribution"].items())[:12])
        more = " ..." if len(p["age_distribution"]) > 12 else ""
        out += [""]
        if p["turnover_steps"] is not None:
            out.append(f"turnover: {p['turnover_steps']:g} steps to drain a full buffer (capacity / consumed_per_step)")
        out.append(
            f"steady-state age of trained trajectories: mean {p['age_mean']:.2f}, max {p['age_max']}; {dist}{more}"
        )
        out.append(f"suggested {p['reasoning']}")
        if p["age_max_if_not_full"] is not None:
            out.append(
                f"if the rollout is slower than the trainer, the buffer never fills and the oldest trajectory "
                f"trained on is {p['age_max_if_not_full']} step(s) old"
            )
        if p["age_max_if_full"] is not None:
            out.append(
                f"if the buffer ever fills (a trainer stall), the oldest trajectory trained on gets "
                f"{p['age_max_if_full']} step(s) old"
            )
    if p:
        out += ["", "warnings:"] + [f"  - {w}" for w in p["warnings"]] if p["warnings"] else ["", "warnings: none"]
    elif report["missing"]:
        out += [
            "",
            "turnover: not computed; missing "
            + ", ".join(report["missing"])
            + " (supply with --set "
            + "=N --set ".join(report["missing"])
            + "=N)",
        ]
    if report.get("plan_error"):
        out.append(f"turnover: not computed: {report['plan_error']}")
    if report["notes"]:
        out += ["", "notes:"] + [f"  - {n}" for n in report["notes"]]
    if report["skipped"]:
        out += ["", "skipped:"] + [f"  {s['path']}: {s['reason']}" for s in report["skipped"]]
    return "\n".join(out)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def to_json(report: Dict[str, Any]) -> str:
    """Returns ``report`` as strict JSON: NaN and infinities (a config may hold them) become "NaN", "inf"."""
    return json.dumps(_finite(report), indent=2, default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("nan", "NaN")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def run(args: argparse.Namespace) -> int:
    try:
        overrides = parse_set(args.set)
        report = analyse(args.paths, overrides, args.base, args.config_name)
    except ValueError as exc:  # a bad --set, or a script / config folder that is not one verl run
        print(f"rhythm: {exc}", file=sys.stderr)
        return 2
    print_output(to_json(report) if args.json else format_report(report, args.all))
    # 2 when nothing could be read or planned; warnings alone do not fail the command.
    return 0 if report["files"] or report["findings"] or report["plan"] else 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rhythm", help="find the produce/store/consume rhythm in configs and suggest max_age")
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="config files (YAML, JSON, TOML), directories, a verl config folder or a verl launch script (.sh)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"supply or override a value: one of {', '.join(RHYTHM_KEYS)}, or a dotted config key",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable output")
    p.add_argument("--all", action="store_true", help="list every matched key, not only those that decide the rhythm")
    p.add_argument(
        "--base",
        metavar="FOLDER",
        help="the verl config folder (verl/trainer/config) a launch script's overrides apply to",
    )
    p.add_argument(
        "--config-name",
        metavar="NAME",
        help="the trainer config of a Hydra config folder (default: the script's, else main_ppo's ppo_trainer)",
    )
    p.set_defaults(run=run)
