"""A reader of bash text as far as the text alone decides it: words, quotes, expansions, arrays.

``launch_script`` uses it to read verl launch scripts without running them. Literal assignments,
``${VAR:-default}``, ``${VAR}``/``$VAR``, arrays and ``"${ARR[@]}"``, ``$((...))`` integer arithmetic,
quotes, comments and line continuations are expanded; ``$(command)``, backticks and variables never set
are left as placeholders and reported by name.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ARRAY_START = re.compile(rf"({NAME})(\+?)=\(")
_SEPARATORS = (";;", "&&", "||", ";", "|", "&", "\n")


class ShellTextError(ValueError):
    """The text cannot be read as bash (an unclosed quote, parenthesis or array)."""


@dataclass(frozen=True)
class Word:
    """One shell word after expansion: its text, the line it starts on, and what could not be expanded."""

    text: str
    line: int
    unresolved: Tuple[str, ...] = ()
    defaults: Tuple[str, ...] = ()  # variables whose ${VAR:-default} default was used
    conditional: Tuple[str, ...] = ()  # variables also assigned inside an if/case/loop


@dataclass
class Var:
    value: Union[str, List[Word]]  # an array keeps its items as words: their lines and unresolved names
    line: int
    unresolved: Tuple[str, ...] = ()  # of a string value: what its assignment could not expand
    defaults: Tuple[str, ...] = ()
    conditional: bool = False
    also: List[int] = field(default_factory=list)  # lines of conditional reassignments


class Reader:
    """A small reader of bash text: words with quotes and expansions, split into commands."""

    def __init__(self, text: str, variables: Dict[str, Var]) -> None:
        self.s, self.i, self.line = text, 0, 1
        self.vars = variables

    # ------------------------------------------------------------------ low level
    def _peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def _advance(self, n: int = 1) -> str:
        out = self.s[self.i : self.i + n]
        self.line += out.count("\n")
        self.i += n
        return out

    def _skip_blanks(self) -> None:
        while True:
            c = self._peek()
            if c and c in " \t":
                self._advance()
            elif c == "\\" and self._peek(1) == "\n":  # line continuation
                self._advance(2)
            elif c == "#":
                while self._peek() not in ("", "\n"):
                    self._advance()
            else:
                return

    def _matching(self, open_: str, close: str) -> str:
        """Consumes text up to the ``close`` that balances an already consumed ``open_``; returns the inside."""
        depth, start = 1, self.i
        while self._peek():
            c = self._peek()
            if c == "\\":
                self._advance(2)
                continue
            if c and c in "'\"":
                self._quoted_raw(c)
                continue
            if self.s.startswith(open_, self.i):
                depth += 1
                self._advance(len(open_))
                continue
            if self.s.startswith(close, self.i):
                depth -= 1
                if depth == 0:
                    inside = self.s[start : self.i]
                    self._advance(len(close))
                    return inside
                self._advance(len(close))
                continue
            self._advance()
        raise ShellTextError(f"line {self.line}: '{open_}' is never closed by '{close}'")

    def _quoted_raw(self, q: str) -> None:
        self._advance()
        while self._peek() and self._peek() != q:
            self._advance(2 if self._peek() == "\\" and q == '"' else 1)
        self._advance()

    # ------------------------------------------------------------------ expansions
    def _expand_dollar(self, quoted: bool, acc: _Acc) -> None:
        self._advance()  # the $
        c = self._peek()
        if self.s.startswith("((", self.i):
            self._advance(2)
            expr = self._matching("((", "))")
            acc.add_arith(expr, self)
        elif c == "(":
            self._advance()
            self._matching("(", ")")
            acc.unresolve("$(...)")
        elif c == "{":
            self._advance()
            inside = self._matching("{", "}")
            acc.add_param(inside, self, quoted)
        elif c == "@" or c == "*":
            self._advance()
            acc.positional(quoted)
        elif c and (c.isdigit() or c in "#?$!-"):
            self._advance()
            acc.unresolve("$" + c)
        else:
            m = re.match(NAME, self.s[self.i :])
            if not m:
                acc.text("$")
                return
            self._advance(m.end())
            acc.add_var(m.group(0), self, quoted)

    def word(self) -> Optional[List[Word]]:
        """Reads one word (a list: an array expansion yields several, "$@" none); None at a separator or end."""
        self._skip_blanks()
        c = self._peek()
        if not c:
            return None
        for sep in _SEPARATORS:
            if self.s.startswith(sep, self.i):
                return None
        m = _ARRAY_START.match(self.s, self.i)
        if m:
            return [self._array_assignment(m)]
        acc = _Acc(self.line)
        while True:
            c = self._peek()
            if not c or c in " \t\n;&|" or (c == "\\" and self._peek(1) == "\n"):
                break
            if c in "()":  # ends a word outside quotes; alone, it is a word of its own (case patterns)
                if not acc.parts:
                    self._advance()
                    acc.text(c)
                break
            if c == "'":
                self._advance()
                start = self.i
                while self._peek() and self._peek() != "'":
                    self._advance()
                acc.text(self.s[start : self.i])
                acc.saw_quote = True
                self._advance()
            elif c == '"':
                self._advance()
                acc.saw_quote = True
                while self._peek() and self._peek() != '"':
                    if self._peek() == "\\" and self._peek(1) == "\n":  # a continuation: bash drops both;
                        self._advance(2)  # the newline is kept so that split words know their own line
                        acc.text("\n")
                    elif self._peek() == "\\" and self._peek(1) and self._peek(1) in '"\\$`':
                        self._advance()
                        acc.text(self._advance())
                    elif self._peek() == "$":
                        self._expand_dollar(True, acc)
                    elif self._peek() == "`":
                        self._backticks(acc)
                    else:
                        acc.text(self._advance())
                self._advance()
            elif c == "\\":
                self._advance()
                acc.text(self._advance())
            elif c == "$":
                self._expand_dollar(False, acc)
            elif c == "`":
                self._backticks(acc)
            else:
                acc.text(self._advance())
        return acc.words()

    def _backticks(self, acc: _Acc) -> None:
        """Skips a `command` substitution: its output is unknown without running it."""
        self._advance()
        while self._peek() and self._peek() != "`":
            self._advance()
        self._advance()
        acc.unresolve("`...`")

    def _array_assignment(self, m: re.Match[str]) -> Word:
        line = self.line
        self._advance(m.end() - self.i)
        items: List[Word] = []
        while True:
            while self._peek() in (" ", "\t", "\n") or (self._peek() == "\\" and self._peek(1) == "\n"):
                self._advance(2 if self._peek() == "\\" else 1)
            if self._peek() == "#":
                while self._peek() not in ("", "\n"):
                    self._advance()
                continue
            if self._peek() == ")":
                self._advance()
                break
            if not self._peek():
                raise ShellTextError(f"line {line}: the array {m.group(1)}=( is never closed")
            got = self.word()
            if got is None:  # a separator inside the array: skip it
                self._advance()
                continue
            items.extend(got)
        return ArrayWord(f"{m.group(1)}{m.group(2)}=()", line, items=tuple(items))

    def command(self) -> Optional[List[Word]]:
        """Reads the words of one command; [] for an empty one; None at the end of the text."""
        if not self._peek():
            return None
        words: List[Word] = []
        while True:
            got = self.word()
            if got is None:
                break
            words.extend(got)
        self._skip_blanks()
        for sep in _SEPARATORS:
            if self.s.startswith(sep, self.i):
                self._advance(len(sep))
                break
        return words


@dataclass(frozen=True)
class ArrayWord(Word):
    items: Tuple[Word, ...] = ()


class _Acc:
    """Collects the pieces of one word while it is read."""

    def __init__(self, line: int) -> None:
        self.line = line
        # (text, None) for literal text; (text, line) for an unquoted expansion, which bash splits on blanks
        self.parts: List[Tuple[str, Optional[int]]] = []
        self.unresolved: List[str] = []
        self.defaults: List[str] = []
        self.conditional: List[str] = []
        self.array: Optional[List[Word]] = None  # set by "${ARR[@]}"
        self.dropped = False  # "$@"
        self.saw_quote = False

    def text(self, t: str) -> None:
        self.parts.append((t, None))

    def value(self, t: str, quoted: bool, line: int) -> None:
        """An expanded value: split into words later unless it was inside double quotes."""
        self.parts.append((t, None if quoted else line))

    def unresolve(self, name: str) -> None:
        """Leaves ``name``'s placeholder in the text: each word later keeps the names whose placeholder it holds."""
        self.unresolved.append(name)
        self.parts.append((placeholder(name), None))

    def positional(self, quoted: bool) -> None:
        if not self.parts:
            self.dropped = True  # "$@": the arguments the script is called with, unknown here
        else:
            self.unresolve("$@")

    def _lookup(self, name: str, reader: Reader) -> Optional[Var]:
        var = reader.vars.get(name)
        if var is not None:
            if var.also:
                self.conditional.append(name)
            self.unresolved.extend(var.unresolved)
            self.defaults.extend(var.defaults)
        return var

    def add_var(self, name: str, reader: Reader, quoted: bool) -> None:
        var = self._lookup(name, reader)
        if var is None:
            self.unresolve(name)
        else:
            self.value(text_of(var.value), quoted, var.line)

    def add_param(self, inside: str, reader: Reader, quoted: bool) -> None:
        m = re.match(rf"^({NAME})\[([@*])\]$", inside)
        if m:
            var = self._lookup(m.group(1), reader)
            if var is None:
                self.unresolve(m.group(1))
            elif isinstance(var.value, list):
                self.array = list(var.value)
            else:
                self.value(var.value, quoted, var.line)
            return
        m = re.match(rf"^({NAME})(:?[-=+?])(.*)$", inside, re.S)
        if m:
            name, op, alt = m.groups()
            var = self._lookup(name, reader)
            value = None if var is None else text_of(var.value)
            empty_counts = op.startswith(":")
            is_set = value is not None and (value != "" or not empty_counts)
            if op.endswith("+"):
                if is_set:
                    self._expand_into(alt, reader)
                return
            if is_set:
                assert value is not None and var is not None
                self.value(value, quoted, var.line)
                return
            if op.endswith("?"):
                self.unresolve(name)
                return
            self.defaults.append(name)
            self._expand_into(alt, reader)
            return
        m = re.match(rf"^({NAME})$", inside)
        if m:
            self.add_var(m.group(1), reader, quoted)
            return
        self.unresolve("${" + inside + "}")

    def _expand_into(self, text: str, reader: Reader) -> None:
        """Expands a default value (``${VAR:-this part}``) into this word."""
        sub = Reader(text, reader.vars)
        words = sub.word() or []
        for w in words:
            self.text(w.text)
            self.unresolved.extend(w.unresolved)
            self.defaults.extend(w.defaults)
            self.conditional.extend(w.conditional)

    def add_arith(self, expr: str, reader: Reader) -> None:
        names = set(re.findall(NAME, expr))
        env: Dict[str, int] = {}
        for name in sorted(names):
            var = self._lookup(name.lstrip("$"), reader)
            try:
                if var is not None and isinstance(var.value, str):
                    env[name] = int(var.value)
            except ValueError:
                pass
        missing = sorted(names - set(env))
        if missing:
            self.unresolve("$((" + expr + "))")
            return
        try:
            self.text(str(_arith(expr.replace("$", ""), env)))
        except (ValueError, ZeroDivisionError, SyntaxError):
            self.unresolve("$((" + expr + "))")

    def words(self) -> List[Word]:
        extra = (tuple(self.unresolved), tuple(self.defaults), tuple(dict.fromkeys(self.conditional)))
        if self.array is not None and not self.parts:  # "${ARR[@]}": the items, each from its own line
            return [
                Word(w.text, w.line, w.unresolved + extra[0], w.defaults + extra[1], w.conditional + extra[2])
                for w in self.array
            ]
        if self.dropped and not self.parts:
            return [Word("$@", self.line, ("$@",))]
        fields = self._split()
        if not fields and self.saw_quote:
            fields = [("", self.line)]
        names = tuple(dict.fromkeys(self.unresolved))
        return [
            Word(text, line, tuple(n for n in names if placeholder(n) in text), *extra[1:]) for text, line in fields
        ]

    def _split(self) -> List[Tuple[str, int]]:
        """Joins the parts into words, splitting unquoted expansions on blanks (bash's field splitting)."""
        fields: List[Tuple[str, int]] = []
        current: Optional[List[Any]] = None  # [text, line]
        for text, origin in self.parts:
            if origin is None:
                if current is None:
                    current = ["", self.line]
                current[0] += text
                continue
            for k, m in enumerate(re.finditer(r"\S+", text)):
                if (k > 0 or m.start() > 0) and current is not None:
                    fields.append((current[0], current[1]))
                    current = None
                if current is None:
                    current = ["", origin + text.count("\n", 0, m.start())]
                current[0] += m.group(0)
            if (not text.strip() or text[-1].isspace()) and text and current is not None:
                fields.append((current[0], current[1]))
                current = None
        if current is not None:
            fields.append((current[0], current[1]))
        return fields


_ARITH_OPS: Dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,  # bash arithmetic is integer
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _arith(expr: str, env: Dict[str, int]) -> int:
    """Evaluates bash integer arithmetic of + - * / % ** and parentheses over known variables."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in env:
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            return _ARITH_OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
        raise ValueError("not integer arithmetic")

    return ev(ast.parse(expr.strip(), mode="eval"))


def placeholder(name: str) -> str:
    """The text an unresolved name leaves in a word: ``${NAME}`` for a variable, the construct itself otherwise."""
    return name if name[:1] and name[:1] in "$`" else "${" + name + "}"


def text_of(value: Union[str, List[Word]]) -> str:
    """A variable's value as one string (an array's items joined by spaces, as ``$ARR`` would not, but close)."""
    return value if isinstance(value, str) else " ".join(w.text for w in value)
