"""Reading YAML, JSON and TOML config files into flat (dotted key, value, line) entries.

Used by ``rhythm``: every leaf of a config becomes one entry that remembers the line it
was written on, so the user can jump from the table straight to the file. A file that
cannot be read is reported with a reason and skipped; nothing here raises on bad input.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Iterator, List, Tuple

CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
# Directories a recursive search never enters: environments, caches, VCS metadata.
_SKIP_DIRS = {".git", ".hg", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".mypy_cache", "build"}
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z0-9_.\-]+)\}$")


@dataclass(frozen=True)
class Entry:
    """One leaf of a config file: where it is, its dotted key and its parsed value."""

    path: str
    line: int  # 1-based; 0 when the format gives no position
    key: str
    value: Any


def find_config_files(paths: List[str]) -> Tuple[List[str], List[Tuple[str, str]]]:
    """Returns (config files to read, [(path, reason)] skipped); directories are searched recursively.

    A file named explicitly is read whatever its suffix (as YAML unless it ends in .json or
    .toml); inside a directory only .yaml, .yml, .json and .toml files are read.
    """
    files: List[str] = []
    skipped: List[Tuple[str, str]] = []
    for path in paths:
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
                found += [os.path.join(root, n) for n in sorted(names) if n.lower().endswith(CONFIG_SUFFIXES)]
            if not found:
                skipped.append((path, "directory holds no .yaml, .yml, .json or .toml file"))
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            skipped.append((path, "no such file or directory; pass a config file or a directory of configs"))
    return files, skipped


def read_config(path: str) -> Tuple[List[Entry], str]:
    """Returns (entries, "") for a readable config, or ([], reason) when it cannot be parsed."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        return [], f"cannot open: {exc.strerror or exc}"
    if b"\0" in raw[:8192]:
        return [], "binary file (NUL bytes), not a YAML/JSON/TOML config"
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return [], f"not UTF-8 text (byte {exc.start}); save the config as UTF-8"
    lower = path.lower()
    try:
        if lower.endswith(".json"):
            entries = _read_json(path, text)
        elif lower.endswith(".toml"):
            entries = _read_toml(path, text)
        else:
            entries = _read_yaml(path, text)
    except _Unreadable as exc:
        return [], str(exc)
    return _resolve_interpolations(entries), ""


class _Unreadable(Exception):
    """A config that does not parse; the message is the reason shown to the user."""


def _read_yaml(path: str, text: str) -> List[Entry]:
    import yaml

    loader = yaml.SafeLoader(text)
    entries: List[Entry] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                entries += _walk_yaml(path, loader, node, "")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _Unreadable(f"invalid YAML{where}: {problem}") from None
    finally:
        loader.dispose()
    return entries


def _walk_yaml(path: str, loader: Any, node: Any, prefix: str) -> Iterator[Entry]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(loader.construct_object(key_node, deep=True)) if isinstance(key_node, yaml.ScalarNode) else "?"
            dotted = f"{prefix}.{key}" if prefix else key
            if isinstance(value_node, (yaml.MappingNode, yaml.SequenceNode)) and value_node.value and not _is_flat_list(value_node):
                yield from _walk_yaml(path, loader, value_node, dotted)
            else:
                yield Entry(path, key_node.start_mark.line + 1, dotted, loader.construct_object(value_node, deep=True))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            dotted = f"{prefix}.{i}" if prefix else str(i)
            if isinstance(item, (yaml.MappingNode, yaml.SequenceNode)):
                yield from _walk_yaml(path, loader, item, dotted)


def _is_flat_list(node: Any) -> bool:
    import yaml

    return isinstance(node, yaml.SequenceNode) and all(isinstance(n, yaml.ScalarNode) for n in node.value)


def _read_json(path: str, text: str) -> List[Entry]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    # JSON is YAML, so the YAML walk gives line numbers; fall back to none if PyYAML disagrees.
    try:
        return _read_yaml(path, text)
    except _Unreadable:
        return [Entry(path, 0, k, v) for k, v in _flatten(data, "")]


def _read_toml(path: str, text: str) -> List[Entry]:
    try:
        import tomllib as toml  # Python 3.11+
    except ImportError:
        try:
            import tomli as toml  # type: ignore[no-redef]
        except ImportError:
            raise _Unreadable("TOML needs Python 3.11+ (tomllib) or `pip install tomli`; convert it to YAML/JSON otherwise") from None
    try:
        data = toml.loads(text)
    except Exception as exc:  # tomllib.TOMLDecodeError; tomli's has the same name but another class
        raise _Unreadable(f"invalid TOML: {exc}") from None
    lines = _toml_lines(text)
    return [Entry(path, lines.get(k, 0), k, v) for k, v in _flatten(data, "")]


_TOML_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_\-.\"' ]+?)\s*=")


def _toml_lines(text: str) -> dict:
    """Maps dotted keys to the line that sets them (tomllib keeps no positions)."""
    lines, table = {}, ""
    for number, line in enumerate(text.splitlines(), 1):
        if m := _TOML_TABLE.match(line):
            table = _unquote(m.group(1))
        elif m := _TOML_KEY.match(line):
            key = _unquote(m.group(1))
            lines.setdefault(f"{table}.{key}" if table else key, number)
    return lines


def _unquote(dotted: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in dotted.split("."))


def _flatten(data: Any, prefix: str) -> Iterator[Tuple[str, Any]]:
    if isinstance(data, dict) and data:
        for k, v in data.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(data, list) and any(isinstance(v, (dict, list)) for v in data):
        for i, v in enumerate(data):
            yield from _flatten(v, f"{prefix}.{i}" if prefix else str(i))
    elif prefix:
        yield prefix, data


def _resolve_interpolations(entries: List[Entry]) -> List[Entry]:
    """Replaces Hydra/OmegaConf ``${a.b}`` values that point at another key of the same file."""
    by_key = {e.key: e.value for e in entries}
    out = []
    for e in entries:
        value, seen = e.value, set()
        while isinstance(value, str) and (m := _INTERPOLATION.match(value)) and m.group(1) in by_key and m.group(1) not in seen:
            seen.add(m.group(1))
            value = by_key[m.group(1)]
        out.append(Entry(e.path, e.line, e.key, value) if value is not e.value else e)
    return out
