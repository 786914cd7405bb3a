"""Bug injection: small source mutations of a function, each a minimal edit of the source text.

Operators (each yields at most one mutant per site):

- ``binop``: ``+``↔``-``, ``*``→``//``, ``//``→``*``, ``/``→``*``, ``%``→``//``, ``&``↔``|``,
  ``<<``↔``>>`` (also in augmented assignments; not on a ``+`` with a string literal side);
- ``compare``: ``<``↔``<=``, ``>``↔``>=``, ``==``↔``!=``, ``is``↔``is not``, ``in``↔``not in``;
- ``boolop``: ``and``↔``or`` (the first pair of a chain);
- ``off_by_one``: an integer literal in a comparison, arithmetic, subscript or ``range()`` call → n+1
  (and n−1 when n > 0);
- ``remove_branch``: an ``if`` statement without ``else`` is deleted (``pass`` if it was alone);
- ``remove_return``: a ``return <value>`` statement is deleted (``pass`` if it was alone);
- ``swap_args``: the first two positional arguments of a call on one line are swapped;
- ``drop_not``: ``not x`` → ``x``.

Only the operator token, literal or statement changes; the rest of the file keeps its exact text.
A mutant is kept only if it parses and its AST differs from the original. It is stored as an
:class:`~dsv32.envs.swe.snapshot.Edit` whose ``old`` is the smallest run of whole lines around the
change that occurs once in the file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from dsv32.envs.swe.snapshot import Edit

_BINOPS = {
    ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "//"), ast.FloorDiv: ("//", "*"),
    ast.Div: ("/", "*"), ast.Mod: ("%", "//"), ast.BitAnd: ("&", "|"), ast.BitOr: ("|", "&"),
    ast.LShift: ("<<", ">>"), ast.RShift: (">>", "<<"),
}  # fmt: skip
_CMPOPS = {
    ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"), ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
}  # fmt: skip
OPERATORS = (
    "binop",
    "compare",
    "boolop",
    "off_by_one",
    "remove_branch",
    "remove_return",
    "swap_args",
    "drop_not",
)


@dataclass(frozen=True)
class Mutant:
    """One injected bug: the operator, the function it is in, its line, and the edit."""

    op: str
    function: str
    line: int
    edit: Edit


class _Source:
    """Byte offsets of AST positions (``col_offset`` counts UTF-8 bytes)."""

    def __init__(self, text: str) -> None:
        self.data = text.encode("utf-8")
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, a: int, b: int) -> str:
        return self.data[a:b].decode("utf-8")


def _gap_swap(src: _Source, left: ast.AST, right: ast.AST, old: str, new: str) -> tuple[int, int, str] | None:
    """Replace operator ``old`` in the text between ``left`` and ``right`` by ``new``."""
    a, b = src.span(left)[1], src.span(right)[0]
    gap = src.text(a, b)
    core = gap.strip(" \t\r\n()\\")
    if " ".join(core.split()) != old:
        return None
    return a, b, gap.replace(core, new, 1)


def _whole_lines(src: _Source, node: ast.stmt) -> tuple[int, int] | None:
    """The byte span of the full lines of a statement that has its lines to itself."""
    a, b = src.span(node)
    line_a, line_b = src.starts[node.lineno - 1], src.starts[node.end_lineno]
    if src.text(line_a, a).strip() or src.text(b, line_b).strip() not in ("", ";"):
        return None
    return line_a, line_b


def _remove_stmt(src: _Source, stmt: ast.stmt, siblings: list[ast.stmt]) -> tuple[int, int, str] | None:
    span = _whole_lines(src, stmt)
    if span is None:
        return None
    if len(siblings) > 1:
        return span[0], span[1], ""
    indent = src.text(span[0], src.offset(stmt.lineno, stmt.col_offset))
    return span[0], span[1], f"{indent}pass\n"


def _sites(fn: ast.AST, src: _Source) -> Iterator[tuple[str, int, tuple[int, int, str] | None]]:
    """``(operator, line, (start, end, replacement) or None)`` for every site in ``fn``'s own body
    (nested functions and classes are their own sites)."""
    parents: dict[ast.AST, ast.AST] = {}
    stack = list(ast.iter_child_nodes(fn))
    for child in stack:
        parents[child] = fn
    nodes = []
    while stack:
        node = stack.pop()
        nodes.append(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        for child in ast.iter_child_nodes(node):
            parents[child] = node
            stack.append(child)
    nodes.sort(key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))
    for node in nodes:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            strs = [isinstance(s, (ast.JoinedStr, ast.Constant)) and isinstance(getattr(s, "value", ""), str)
                    for s in (node.left, node.right)]  # fmt: skip
            if not (isinstance(node.op, ast.Add) and any(strs)):
                yield "binop", line, _gap_swap(src, node.left, node.right, *_BINOPS[type(node.op)])
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOPS:
            old, new = _BINOPS[type(node.op)]
            yield "binop", line, _gap_swap(src, node.target, node.value, old + "=", new + "=")
        elif isinstance(node, ast.Compare):
            left = node.left
            for op, right in zip(node.ops, node.comparators):
                if type(op) in _CMPOPS:
                    yield "compare", line, _gap_swap(src, left, right, *_CMPOPS[type(op)])
                left = right
        elif isinstance(node, ast.BoolOp):
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            yield "boolop", line, _gap_swap(src, node.values[0], node.values[1], old, new)
        elif isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 1000:
            parent = parents.get(node)
            in_range = isinstance(parent, ast.Call) and getattr(parent.func, "id", None) == "range"
            if (
                isinstance(parent, (ast.Compare, ast.BinOp, ast.Subscript, ast.Slice, ast.AugAssign))
                or in_range
            ):
                a, b = src.span(node)
                yield "off_by_one", line, (a, b, str(node.value + 1))
                if node.value > 0:
                    yield "off_by_one", line, (a, b, str(node.value - 1))
        elif isinstance(node, ast.If) and not node.orelse and src.text(*src.span(node)).startswith("if"):
            siblings = _block_of(node, parents)
            yield "remove_branch", line, _remove_stmt(src, node, siblings) if siblings else None
        elif isinstance(node, ast.Return) and node.value is not None:
            siblings = _block_of(node, parents)
            yield "remove_return", line, _remove_stmt(src, node, siblings) if siblings else None
        elif (
            isinstance(node, ast.Call)
            and len(node.args) >= 2
            and not any(isinstance(a, ast.Starred) for a in node.args[:2])
        ):
            first, second = node.args[0], node.args[1]
            if first.lineno == first.end_lineno == second.lineno == second.end_lineno:
                (a0, b0), (a1, b1) = src.span(first), src.span(second)
                t0, t1 = src.text(a0, b0), src.text(a1, b1)
                if t0 != t1:
                    yield "swap_args", line, (a0, b1, t1 + src.text(b0, a1) + t0)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            a, b = src.span(node)
            yield "drop_not", line, (a, b, src.text(*src.span(node.operand)))


def _block_of(stmt: ast.stmt, parents: dict) -> list[ast.stmt] | None:
    parent = parents.get(stmt)
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and stmt in block:
            return block
    for handler in getattr(parent, "handlers", []) or []:
        if stmt in handler.body:
            return handler.body
    return None


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Every function and method with its qualified name."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield prefix + child.name, child
                yield from walk(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def first_line(fn: ast.AST) -> int:
    """The line of a function's code object (its first decorator, else ``def``)."""
    return min([fn.lineno] + [d.lineno for d in getattr(fn, "decorator_list", [])])


def mutants(path: str, text: str, covered: set[int] | None = None) -> list[Mutant]:
    """Every valid mutant of the functions in ``text`` (file ``path``); with ``covered``, only of the
    functions whose first line is in it (the ones the tests call)."""
    tree = ast.parse(text)
    original = ast.dump(tree)
    src = _Source(text)
    out: list[Mutant] = []
    for qualname, fn in functions(tree):
        if covered is not None and first_line(fn) not in covered:
            continue
        for op, line, change in _sites(fn, src):
            if change is None:
                continue
            a, b, replacement = change
            new_data = src.data[:a] + replacement.encode("utf-8") + src.data[b:]
            try:
                changed = ast.dump(ast.parse(new_data)) != original
            except SyntaxError:
                continue
            if changed:
                out.append(Mutant(op, qualname, line, _as_edit(path, src, a, b, replacement)))
    return out


def _as_edit(path: str, src: _Source, a: int, b: int, replacement: str) -> Edit:
    """The smallest run of whole lines around bytes ``a:b`` that occurs once in the file before the
    change and once after it (so the edit and its inverse both apply)."""
    lo = max(i for i, s in enumerate(src.starts) if s <= a)
    hi = min(i for i, s in enumerate(src.starts) if s >= b and i > lo)
    text = src.data.decode("utf-8")
    mutated = src.text(0, a) + replacement + src.text(b, len(src.data))
    while True:
        s0, s1 = src.starts[lo], src.starts[hi]
        old, new = src.text(s0, s1), src.text(s0, a) + replacement + src.text(b, s1)
        if (text.count(old) == 1 and mutated.count(new) == 1) or (lo == 0 and hi == len(src.starts) - 1):
            return Edit(path, old, new)
        lo, hi = max(0, lo - 1), min(len(src.starts) - 1, hi + 1)
