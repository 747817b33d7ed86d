"""Reading YAML, JSON and TOML config files into flat (dotted key, value, line) entries.

Used by ``rhythm``: every leaf of a config becomes one entry that remembers the line it
was written on, so the user can jump from the table straight to the file. A file that
cannot be read is reported with a reason and skipped; nothing here raises on bad input.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Tuple

CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")
# Directories a recursive search never enters: environments, caches, VCS metadata.
_SKIP_DIRS = {".git", ".hg", ".venv", "venv", "node_modules", "__pycache__", ".tox", ".mypy_cache", "build"}
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z0-9_.\-]+)\}$")
#: Files above this size are skipped: configs are small, and a multi-megabyte JSON is data (a tokenizer, a dataset).
MAX_CONFIG_BYTES = 2 * 1024 * 1024
#: Leaves read from one file at most; more is data, or a YAML alias bomb ("billion laughs").
MAX_ENTRIES = 20_000
#: Bytes looked at by ``is_binary``.
BINARY_SNIFF_BYTES = 65536


def is_binary(raw: bytes) -> bool:
    """Returns True when ``raw`` looks binary (a NUL byte in its first 64 KiB): the check rhythm and audit share."""
    return b"\0" in raw[:BINARY_SNIFF_BYTES]


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
        size = os.path.getsize(path)
        if size > MAX_CONFIG_BYTES:
            return [], (
                f"{size} bytes, above the {MAX_CONFIG_BYTES // (1024 * 1024)} MiB a config may have "
                "(data, not a config?); pass the config file itself"
            )
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        return [], f"cannot open: {exc.strerror or exc}"
    if is_binary(raw):
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
        return _resolve_interpolations(entries), ""
    except _Unreadable as exc:
        return [], str(exc)
    except RecursionError:
        return [], "nested too deeply to read (recursion limit); flatten the config"
    except MemoryError:
        return [], "too large to read into memory"
    except Exception as exc:  # a parser bug or an input no parser expected: skip the file, never crash the scan
        return [], f"cannot be read ({type(exc).__name__}: {exc})"


class _Unreadable(Exception):
    """A config that does not parse; the message is the reason shown to the user."""


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise _Unreadable("reading YAML needs PyYAML: `pip install pyyaml`") from None
    return yaml


def _read_yaml(path: str, text: str) -> List[Entry]:
    yaml = _yaml()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    entries: List[Entry] = []
    walked: set = set()  # ids of collection nodes already walked: an alias is walked once, not once per use
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                for entry in _walk_yaml(path, loader, node, "", walked):
                    entries.append(entry)
                    if len(entries) > MAX_ENTRIES:
                        raise _Unreadable(
                            f"more than {MAX_ENTRIES} keys (data, not a config?); pass the config file itself"
                        )
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _Unreadable(f"invalid YAML{where}: {problem}") from None
    finally:
        loader.dispose()
    return entries


def _walk_yaml(path: str, loader: Any, node: Any, prefix: str, walked: set) -> Iterator[Entry]:
    yaml = _yaml()
    if id(node) in walked:  # an alias of a collection already read: its keys are listed under the anchor
        return
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(loader.construct_object(key_node, deep=True)) if isinstance(key_node, yaml.ScalarNode) else "?"
            dotted = f"{prefix}.{key}" if prefix else key
            if (
                isinstance(value_node, (yaml.MappingNode, yaml.SequenceNode))
                and value_node.value
                and not _is_flat_list(value_node)
            ):
                yield from _walk_yaml(path, loader, value_node, dotted, walked)
            elif isinstance(value_node, yaml.ScalarNode) or not value_node.value or id(value_node) not in walked:
                walked.add(id(value_node))
                yield Entry(path, key_node.start_mark.line + 1, dotted, loader.construct_object(value_node, deep=True))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            dotted = f"{prefix}.{i}" if prefix else str(i)
            if isinstance(item, (yaml.MappingNode, yaml.SequenceNode)):
                yield from _walk_yaml(path, loader, item, dotted, walked)


def _is_flat_list(node: Any) -> bool:
    yaml = _yaml()
    return isinstance(node, yaml.SequenceNode) and all(isinstance(n, yaml.ScalarNode) for n in node.value)


def _read_json(path: str, text: str) -> List[Entry]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _Unreadable(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    # Values come from json.loads (YAML would read 1e3 and NaN as strings); the YAML walk of the
    # same text gives only line numbers, and none when PyYAML cannot follow it.
    flat = list(_flatten(data, ""))
    if len(flat) > MAX_ENTRIES:
        raise _Unreadable(f"more than {MAX_ENTRIES} keys (data, not a config?); pass the config file itself")
    try:
        lines = {e.key: e.line for e in reversed(_read_yaml(path, text))}  # first line of a key wins
    except Exception:
        lines = {}
    return [Entry(path, lines.get(k, 0), k, v) for k, v in flat]


def _read_toml(path: str, text: str) -> List[Entry]:
    try:
        if sys.version_info >= (3, 11):
            import tomllib as toml
        else:  # a declared dependency below 3.11; missing only in a hand-made environment
            import tomli as toml
    except ImportError:
        raise _Unreadable(
            "TOML needs Python 3.11+ (tomllib) or `pip install tomli`; convert it to YAML/JSON otherwise"
        ) from None
    try:
        data = toml.loads(text)
    except Exception as exc:  # tomllib.TOMLDecodeError; tomli's has the same name but another class
        raise _Unreadable(f"invalid TOML: {exc}") from None
    lines = _toml_lines(text)
    flat = list(_flatten(data, ""))
    if len(flat) > MAX_ENTRIES:
        raise _Unreadable(f"more than {MAX_ENTRIES} keys (data, not a config?); pass the config file itself")
    return [Entry(path, lines.get(k, 0), k, v) for k, v in flat]


_TOML_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_\-.\"' ]+?)\s*=")


def _toml_lines(text: str) -> Dict[str, int]:
    """Maps dotted keys to the line that sets them (tomllib keeps no positions)."""
    lines: Dict[str, int] = {}
    table = ""
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
        while (
            isinstance(value, str)
            and (m := _INTERPOLATION.match(value))
            and m.group(1) in by_key
            and m.group(1) not in seen
        ):
            seen.add(m.group(1))
            value = by_key[m.group(1)]
        out.append(Entry(e.path, e.line, e.key, value) if value is not e.value else e)
    return out
