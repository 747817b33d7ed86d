"""The config a verl run really uses: its trainer config (composed as Hydra would), then a launch script's overrides.

``pyfast-buffer rhythm`` reads a verl config folder (``verl/trainer/config``) and/or a launch script
(``run_*.sh``, read by ``launch_script``). The trainer config is chosen by the script's ``--config-name``,
by ``--config-name`` on our command line, or by the entry point's default (``main_ppo`` uses
``ppo_trainer``); when none of them decides, the candidates are listed and the user is asked to choose.
verl's own flattened copy (``_generated_<name>.yaml``) is read when it exists and the script does not
choose another option of a config group; otherwise ``<name>.yaml`` is composed from its ``defaults`` list.
Every entry keeps the file and line it comes from, so a value set by the script points at the script.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ._config_files import Entry, read_config
from ._known_keys import match_known
from .launch_script import ENTRY_CONFIGS, LaunchScript, read_launch_script

_SHELL_SUFFIXES = (".sh", ".bash")
_GENERATED = "_generated_"


class RhythmInputError(ValueError):
    """What rhythm was given cannot be read as one verl run: the message says what to pass instead."""


@dataclass
class VerlRun:
    """The entries of one verl run's config, the files they came from, and what was decided on the way."""

    entries: List[Entry] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    config: str = ""  # the trainer config read, "" when there was none
    script: Optional[LaunchScript] = None


def is_launch_script(path: str) -> bool:
    """A shell script, by its suffix or its ``#!`` line."""
    if path.lower().endswith(_SHELL_SUFFIXES):
        return True
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and (b"sh" in first.split(b"/")[-1])


def trainer_configs(folder: str) -> Dict[str, str]:
    """The trainer configs of a Hydra config folder: {name: path} of its top-level YAML files with a defaults list."""
    out: Dict[str, str] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        path = os.path.join(folder, name)
        if not name.endswith((".yaml", ".yml")) or not os.path.isfile(path):
            continue
        stem = name.rsplit(".", 1)[0]
        if stem.startswith(_GENERATED) or _has_defaults(path):
            out[stem] = path
    return out


def is_hydra_config_folder(path: str) -> bool:
    """A folder whose top level holds at least one config with a Hydra ``defaults`` list (verl/trainer/config)."""
    return os.path.isdir(path) and any(not n.startswith(_GENERATED) for n in trainer_configs(path))


def _has_defaults(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return any(line.startswith("defaults:") for line in f)
    except (OSError, UnicodeDecodeError):
        return False


def _find_config_folder(script_path: str, config_path: Optional[str], entry: str) -> Optional[str]:
    """The verl config folder a script names, looked for upwards from the script (it runs from the verl root)."""
    module_dir = "/".join(entry.split(".")[:-1]) if not entry.endswith(".py") else os.path.dirname(entry)
    relative = os.path.normpath(os.path.join(module_dir, config_path or "config"))
    here = os.path.dirname(os.path.abspath(script_path))
    while True:
        candidate = os.path.join(here, relative)
        if os.path.isdir(candidate):
            shown = os.path.relpath(candidate)
            return candidate if shown.startswith("..") else shown
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _entry_default(folder: str, entry: str) -> Tuple[Optional[str], str]:
    """The config name an entry point's ``@hydra.main`` gives, read from its source next to the folder if there."""
    source = entry if entry.endswith(".py") else os.path.join(os.path.dirname(folder), entry.split(".")[-1] + ".py")
    try:
        with open(source, encoding="utf-8") as f:
            m = re.search(r"@hydra\.main\([^)]*config_name=[\"']([^\"']+)[\"']", f.read())
        if m:
            return m.group(1), f"the config_name of {source}'s @hydra.main"
    except (OSError, UnicodeDecodeError):
        pass
    module = entry[:-3].replace("/", ".") if entry.endswith(".py") else entry
    module = module[module.find("verl.") :] if "verl." in module else module
    if module in ENTRY_CONFIGS:
        return ENTRY_CONFIGS[module], f"{module}'s default config"
    return None, ""


def choose_config(folder: str, name: Optional[str], why: str, explicit: bool = True) -> Tuple[str, str]:
    """Returns (name, how it was chosen) of trainer config ``name`` in ``folder``; raises RhythmInputError to ask.

    A name that is only a default (``explicit=False``: the entry point's) gives way to the folder's one
    trainer config when it is not there; with several, the user is asked.
    """
    configs = trainer_configs(folder)
    own = [n for n in configs if not n.startswith(_GENERATED)]
    listing = ", ".join(own) or "none"
    if not explicit and name is not None and name not in configs and _GENERATED + name not in configs:
        if len(own) == 1:
            return own[0], f"the only trainer config in {folder}"
        name, why = None, f"{why}, {name}, is not there"
    if name is None:
        raise RhythmInputError(
            f"{folder} holds several trainer configs ({listing}) and nothing says which one the run uses"
            + (f" ({why})" if why else "")
            + "; choose one with --config-name NAME (e.g. --config-name ppo_trainer)"
        )
    stem = os.path.basename(name).rsplit(".", 1)[0] if name.endswith((".yaml", ".yml")) else os.path.basename(name)
    if stem not in configs and _GENERATED + stem not in configs:
        raise RhythmInputError(
            f"trainer config {name!r} ({why}) is not in {folder}; the configs there are: {listing}. "
            "Pass --config-name with one of them, or --base with the folder that holds it"
        )
    return stem, why


def read_verl_run(
    paths: List[str], base: Optional[str] = None, config_name: Optional[str] = None, notes: Optional[List[str]] = None
) -> Optional[VerlRun]:
    """The verl run that ``paths`` describe (a launch script and/or a config folder), or None when they are
    ordinary config files. Raises LaunchScriptError / RhythmInputError with what to pass instead."""
    scripts = [p for p in paths if os.path.isfile(p) and is_launch_script(p)]
    folders = [p for p in paths if is_hydra_config_folder(p)]
    if base is not None:
        if not is_hydra_config_folder(base):
            raise RhythmInputError(
                f"--base {base!r} is not a Hydra config folder (no top-level YAML with a defaults list); "
                "pass verl's verl/trainer/config"
            )
        folders = [base]
    if not scripts and not folders:
        return None
    if len(scripts) > 1:
        raise RhythmInputError(
            f"{len(scripts)} launch scripts given ({', '.join(scripts)}); rhythm reads one run: pass one script"
        )
    run = VerlRun()
    script = read_launch_script(scripts[0]) if scripts else None
    run.script = script
    folder = folders[0] if folders else None
    if script is not None:
        run.files.append(script.path)
        run.notes += script.notes
        named = script.config_path.text if script.config_path and not script.config_path.unresolved else None
        if folder is None:
            folder = _find_config_folder(script.path, named, script.entry)
            if folder is None:
                run.notes.append(
                    f"no verl config folder found above {script.path}: only the script's overrides are read "
                    "(pass --base path/to/verl/trainer/config for the defaults they override)"
                )
    name, why = config_name, "--config-name"
    if name is None and script is not None and script.config_name is not None:
        if script.config_name.unresolved:
            name, why = (
                None,
                (
                    f"{script.path}:{script.config_name.line} passes --config-name={script.config_name.text}, "
                    "whose value the script alone does not decide"
                ),
            )
        else:
            name, why = script.config_name.text, f"{script.path}:{script.config_name.line} --config-name"
    if folder is not None:
        explicit = True
        if name is None and not (script is not None and script.config_name is not None and why):
            explicit = False
            name, why = _entry_default(folder, script.entry if script else "verl.trainer.main_ppo")
            if script is None:
                why = f"{why}; the run is assumed to start verl.trainer.main_ppo (--config-name to choose another)"
        stem, how = choose_config(folder, name, why, explicit)
        groups = {o.key: o for o in (script.overrides if script else []) if "." not in o.key and not o.prefix}
        entries, files, config = _compose(folder, stem, groups, run.notes)
        others = [n for n in trainer_configs(folder) if not n.startswith(_GENERATED) and n != stem]
        run.notes.insert(
            0, f"trainer config: {config} ({how})" + (f"; also here: {', '.join(others)}" if others else "")
        )
        run.entries, run.config = entries, config
        run.files = files + run.files
    if script is not None:
        run.entries = apply_overrides(run.entries, script, run.notes)
    return run


def apply_overrides(entries: List[Entry], script: LaunchScript, notes: List[str]) -> List[Entry]:
    """The entries with the script's overrides applied as Hydra applies them (later wins; ``~`` deletes)."""
    by_key: Dict[str, Entry] = {e.key: e for e in entries}
    for o in script.overrides:
        if o.prefix == "~":
            by_key = {k: e for k, e in by_key.items() if k != o.key and not k.startswith(o.key + ".")}
            continue
        known = match_known(o.key)
        if known is not None and known.role:  # only where the rhythm needs the value
            where = f"{script.path}:{o.line}: {o.key}"
            if o.unresolved:
                notes.append(
                    f"{where} is set from {', '.join(o.unresolved)}, which the script does not set; the value is "
                    f"unknown here (--set {o.key}=VALUE supplies it)"
                )
            elif o.defaults:
                notes.append(
                    f"{where}={o.value} is the default of {', '.join('${' + d + ':-...}' for d in o.defaults)}; "
                    "the environment the script runs in may set another"
                )
            if o.conditional:
                notes.append(
                    f"{where} uses {', '.join(o.conditional)}, which the script also sets inside an if/case/loop; "
                    "read here: the value set outside it"
                )
        if isinstance(o.value, dict):
            by_key = {k: e for k, e in by_key.items() if not k.startswith(o.key + ".")}
        by_key[o.key] = Entry(script.path, o.line, o.key, None if o.unresolved else o.value)
    return list(by_key.values())


def _compose(
    folder: str, stem: str, group_overrides: Dict[str, Any], notes: List[str]
) -> Tuple[List[Entry], List[str], str]:
    """Reads trainer config ``stem``: verl's flattened copy when it exists and no group option changes, else
    ``stem.yaml`` composed from its defaults list."""
    generated = os.path.join(folder, f"{_GENERATED}{stem}.yaml")
    plain = os.path.join(folder, f"{stem}.yaml")
    if os.path.isfile(generated) and not group_overrides:
        entries, reason = read_config(generated)
        if reason:
            raise RhythmInputError(f"{generated}: {reason}")
        return entries, [generated], generated
    if not os.path.isfile(plain):
        raise RhythmInputError(
            f"{plain} does not exist, and {generated} cannot take the group choices "
            f"{', '.join(group_overrides)}; pass --base with the full config folder"
        )
    files: List[str] = []
    entries = _compose_file(folder, plain, "", {k: o.value for k, o in group_overrides.items()}, files, notes, 0)
    merged: Dict[str, Entry] = {}
    for e in entries:
        merged[e.key] = e
    return list(merged.values()), files, plain


def _search_path(folder: str) -> List[str]:
    """verl's other config folder: a recipe's config (experimental/.../config) builds on verl/trainer/config."""
    here = os.path.abspath(folder)
    while os.path.basename(here) not in ("verl", ""):
        here = os.path.dirname(here)
    trainer = os.path.join(here, "trainer", "config")
    return [trainer] if os.path.basename(here) == "verl" and os.path.isdir(trainer) else []


def _compose_file(
    folder: str, path: str, package: str, choices: Dict[str, Any], files: List[str], notes: List[str], depth: int
) -> List[Entry]:
    if depth > 16:
        raise RhythmInputError(f"{path}: defaults nest more than 16 deep; is there a cycle?")
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise RhythmInputError(f"{path}: cannot be read ({exc})") from None
    own, reason = read_config(path)
    if reason:
        raise RhythmInputError(f"{path}: {reason}")
    files.append(path)
    own = [
        Entry(e.path, e.line, f"{package}.{e.key}" if package else e.key, e.value)
        for e in own
        if not e.key.startswith("defaults")
    ]
    defaults = raw.get("defaults", []) if isinstance(raw, dict) else []
    local = {next(iter(d)): d[next(iter(d))] for d in defaults if isinstance(d, dict) and len(d) == 1}
    local.update({k: v for k, v in choices.items() if k in local or depth == 0})
    out: List[Entry] = []
    self_done = False
    for item in defaults if isinstance(defaults, list) else []:
        if item == "_self_":
            out += own
            self_done = True
            continue
        option: Any
        if isinstance(item, str):
            group, option, pkg = "", item, package
        elif isinstance(item, dict) and len(item) == 1:
            spec, option = next(iter(item.items()))
            spec = re.sub(r"^override\s+", "", str(spec).lstrip("+"))
            group, _, at = spec.partition("@")
            pkg = at if at else group.replace("/", ".")
            pkg = "" if pkg in ("_global_", "_here_") else pkg
            if package and pkg:
                pkg = f"{package}.{pkg}"
            option = choices.get(group, option) if depth == 0 else option
        else:
            continue
        if option is None:
            continue
        option = re.sub(r"\$\{(\w+)\}", lambda m: str(local.get(m.group(1), m.group(0))), str(option))
        found = None
        for root in (os.path.dirname(path), folder, *_search_path(folder)):
            candidate = os.path.join(root, group, f"{option}.yaml")
            if os.path.isfile(candidate):
                found = candidate
                break
        if found is None:
            notes.append(f"{path}: default {item!r} names {os.path.join(group, option)}.yaml, which is not there")
            continue
        out += _compose_file(folder, found, pkg if group else package, {}, files, notes, depth + 1)
    if not self_done:
        out += own
    return out
