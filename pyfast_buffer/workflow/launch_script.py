"""Reads the Hydra overrides of a verl launch script (``run_*.sh``), without running it.

verl users configure a run in a shell script: ``NAME=${NAME:-default}`` settings, bash arrays of
``key=value`` overrides, and one ``python3 -m verl.trainer.main_ppo "${ARR[@]}" ...`` command. This module
reads that text as bash would expand it, as far as the script itself decides: literal assignments,
``${VAR:-default}`` (the default, since the environment is not read), ``${VAR}``/``$VAR``, arrays and
their ``"${ARR[@]}"`` expansion, ``+=`` appends, ``$((...))`` integer arithmetic, quotes and line
continuations. Anything else (``$(command)``, a variable the script never sets, ``"$@"``) is reported as
unresolved, never guessed. Assignments inside ``if``/``case``/loops are conditional: the value set outside
them is kept and the others are noted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import yaml

from .bash_words import NAME, ArrayWord, Reader, ShellTextError, Var, Word, text_of

#: verl entry modules and the trainer config their ``@hydra.main`` names (used when --config-name is absent
#: and the module's source is not at hand to read it from).
ENTRY_CONFIGS = {
    "verl.trainer.main_ppo": "ppo_trainer",
    "verl.trainer.sft_trainer": "sft_trainer_engine",
    "verl.trainer.sft_trainer_ray": "sft_trainer_engine",
    "verl.trainer.main_eval": "evaluation",
    "verl.experimental.fully_async_policy.fully_async_main": "fully_async_ppo_trainer",
    "verl.experimental.one_step_off_policy.main_ppo": "one_step_off_ppo_trainer",
}
_ASSIGN = re.compile(rf"^({NAME})(\+?)=(.*)$", re.S)
_OVERRIDE = re.compile(r"^(~|\+\+|\+)?([A-Za-z_@][\w@.\-/]*)(=(.*))?$", re.S)
_OPENERS = {"if", "case", "for", "while", "until", "select"}
_CLOSERS = {"fi", "esac", "done"}
_LEADERS = {"then", "do", "else", "elif", "{", "}", "!", "time"}


class LaunchScriptError(ValueError):
    """The script holds no verl launch command, or cannot be read as one."""


@dataclass(frozen=True)
class Override:
    """One Hydra override of the launch command."""

    key: str  # the dotted key, without its + / ++ / ~ prefix
    value: Any  # read as Hydra reads a value (a YAML scalar or flow list/dict); the text when unresolved
    text: str  # the override as bash would pass it
    line: int
    prefix: str = ""  # "", "+" (add), "++" (add or override), "~" (delete)
    unresolved: Tuple[str, ...] = ()
    defaults: Tuple[str, ...] = ()
    conditional: Tuple[str, ...] = ()


@dataclass
class LaunchScript:
    """The verl command of a launch script: its entry point, config choice and overrides."""

    path: str
    line: int
    entry: str  # e.g. verl.trainer.main_ppo, or the script path run by python
    config_path: Optional[Word] = None
    config_name: Optional[Word] = None
    overrides: List[Override] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def _hydra_value(text: str) -> Any:
    """A Hydra override value as Hydra reads it (close enough: YAML's reading of the text)."""
    if text == "":
        return ""
    for number in (int, float):  # Hydra reads 1e-6 as a float, where YAML 1.1 keeps a string
        try:
            return number(text)
        except ValueError:
            pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _launch_index(words: List[Word]) -> Optional[Tuple[int, str]]:
    """Where the verl entry point is in a command, and its name: ``-m verl.x.y`` or ``.../verl/.../x.py``."""
    for k, w in enumerate(words):
        if w.text == "-m" and k + 1 < len(words) and words[k + 1].text.startswith("verl."):
            return k + 1, words[k + 1].text
        if re.search(r"(^|/)verl/[\w/]+\.py$", w.text) and k > 0 and "python" in words[k - 1].text:
            return k, w.text
    return None


def read_launch_script(path: str) -> LaunchScript:
    """Returns the verl launch command of the script at ``path``; raises LaunchScriptError without one."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise LaunchScriptError(f"{path}: cannot be read as a shell script ({exc})") from None
    return parse_launch_script(text, path)


def parse_launch_script(text: str, path: str = "<script>") -> LaunchScript:
    """Parses the text of a launch script (see the module docstring); ``path`` names it in messages and rows."""
    variables: Dict[str, Var] = {}
    reader = Reader(text, variables)
    depth = 0
    launches: List[Tuple[List[Word], int, str]] = []
    while True:
        try:
            words = reader.command()
        except ShellTextError as exc:
            raise LaunchScriptError(f"{path}: {exc}") from None
        if words is None:
            break
        while words and words[0].text in _LEADERS:
            words = words[1:]
        if not words:
            continue
        head = words[0].text
        if head in _OPENERS:
            depth += 1
            continue
        if head in _CLOSERS:
            depth = max(0, depth - 1)
            continue
        if head in ("export", "local", "readonly", "declare", "typeset"):
            words = [w for w in words[1:] if not w.text.startswith("-")]
            if not words:
                continue
        found = _launch_index(words)
        if found is not None:
            launches.append((words, found[0], found[1]))
            continue
        if all(isinstance(w, ArrayWord) or _ASSIGN.match(w.text) for w in words):
            for w in words:
                _assign(variables, w, conditional=depth > 0)
    if not launches:
        raise LaunchScriptError(
            f"{path}: no verl launch command found (a line running `python3 -m verl.trainer.main_ppo ...` or "
            "`python3 verl/trainer/main_ppo.py ...`); rhythm reads that command's Hydra overrides and never runs "
            "the script. Pass a script that launches verl, or the config itself (pyfast-buffer rhythm "
            "path/to/verl/trainer/config --config-name ppo_trainer)"
        )
    words, at, entry = launches[0]
    script = LaunchScript(path, words[at].line, entry)
    if len(launches) > 1:
        others = ", ".join(str(w[w_at].line) for w, w_at, _ in launches[1:])
        script.notes.append(f"{path} launches verl more than once (lines {script.line}, {others}); read the first")
    _read_arguments(script, words[at + 1 :])
    return script


def _assign(variables: Dict[str, Var], w: Word, conditional: bool) -> None:
    if isinstance(w, ArrayWord):
        name, append = w.text.split("=", 1)[0].rstrip("+"), w.text.split("=", 1)[0].endswith("+")
        items: List[Word] = list(w.items)
        old = variables.get(name)
        if append and old is not None and isinstance(old.value, list):
            items = old.value + items
        value: Union[str, List[Word]] = items
    else:
        m = _ASSIGN.match(w.text)
        assert m is not None
        name, append, text = m.group(1), bool(m.group(2)), m.group(3)
        old = variables.get(name)
        if append and old is not None:
            text = text_of(old.value) + text
        value = text
    old = variables.get(name)
    if conditional and old is not None and not old.conditional:
        old.also.append(w.line)  # keep the value set outside the if/case
        return
    unresolved = () if isinstance(w, ArrayWord) else tuple(dict.fromkeys(w.unresolved))
    defaults = () if isinstance(w, ArrayWord) else tuple(dict.fromkeys(w.defaults))
    variables[name] = Var(value, w.line, unresolved, defaults, conditional, [] if old is None else old.also)


def _read_arguments(script: LaunchScript, words: List[Word]) -> None:
    k = 0
    while k < len(words):
        w = words[k]
        k += 1
        if w.text == "$@":
            script.notes.append(
                f'{script.path}:{w.line}: the script passes its own arguments ("$@") to verl; overrides given '
                "on its command line are not known here"
            )
            continue
        for flag, attr in (
            ("--config-name", "config_name"),
            ("-cn", "config_name"),
            ("--config-path", "config_path"),
            ("-cp", "config_path"),
        ):
            if w.text == flag and k < len(words):
                setattr(script, attr, words[k])
                k += 1
                break
            if w.text.startswith(flag + "="):
                setattr(script, attr, Word(w.text[len(flag) + 1 :], w.line, w.unresolved, w.defaults, w.conditional))
                break
        else:
            m = _OVERRIDE.match(w.text)
            if not m or (m.group(3) is None and m.group(1) != "~"):
                if w.text.startswith("-"):
                    script.notes.append(f"{script.path}:{w.line}: option {w.text!r} is not a Hydra override; ignored")
                else:
                    script.notes.append(f"{script.path}:{w.line}: {w.text!r} is not a key=value override; ignored")
                continue
            prefix, key, raw = m.group(1) or "", m.group(2), m.group(4)
            value = raw if w.unresolved or raw is None else _hydra_value(raw)
            script.overrides.append(
                Override(key, value, w.text, w.line, prefix, w.unresolved, w.defaults, w.conditional)
            )
