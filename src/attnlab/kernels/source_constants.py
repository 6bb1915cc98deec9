"""The compile-time constants of a kernel's source, read from the source: the one place they are written.

The registry's launch geometry needs a kernel's tile sizes (threads per block, keys per tile, ...).
Rather than copy each number into Python, it reads the namespace-level `constexpr int NAME = ...;`
and `#define NAME <integer>` lines of the .cu (and the headers it names) and evaluates their
integer expressions. A constant a chapter-8 knob may override is written as

    #ifdef ATTN07_WARPS
    constexpr int WARPS = ATTN07_WARPS;
    #else
    constexpr int WARPS = 4;
    #endif

and reads as the source's own value (4): the knob's define is not set when nothing is passed.
Definitions inside functions and templates (indented lines) are not constants of the file.
"""
from __future__ import annotations

import ast
import functools
import operator
import re

from ..paths import kernels_dir

_DEFINITION = re.compile(r"^(?:constexpr int ([A-Z][A-Z0-9_]*) = ([^;]+);|#define ([A-Z][A-Z0-9_]*) (\d+))", re.M)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _evaluate(expr: str, known: dict[str, int]) -> int | None:
    """An integer expression of literals, known names, + - * and / (integer division), or None."""
    try:
        tree = ast.parse(expr.replace("/", "//"), mode="eval").body
    except SyntaxError:
        return None

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return known[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise KeyError(ast.dump(node))

    try:
        return value(tree)
    except KeyError:
        return None


def _definitions(text: str, known: dict[str, int]) -> dict[str, int]:
    """The constants `text` defines, in order, each evaluated with `known` and those before it."""
    own: dict[str, int] = {}
    for m in _DEFINITION.finditer(text):
        const, expr, define, number = m.groups()
        if define is not None:
            own.setdefault(define, int(number))
            continue
        value = _evaluate(expr.split("//")[0].strip(), {**known, **own})
        if value is not None:  # (an expression of a knob's define: the #else line holds the value)
            own[const] = value
    return own


@functools.cache
def _file(name: str, headers: tuple[str, ...]) -> dict[str, int]:
    known: dict[str, int] = {}
    for header in headers:
        known.update(_file(header, ()))
    return {**known, **_definitions((kernels_dir() / name).read_text(), known)}


def constants(name: str, *headers: str) -> dict[str, int]:
    """NAME -> value of every integer constant the file kernels/`name` defines at namespace level,
    with `headers`' constants (which its expressions may use) read first. A file that redefines a
    name keeps its own value."""
    return dict(_file(name, headers))


def constant(name: str, const: str, *headers: str) -> int:
    """One constant of kernels/`name` (a KeyError naming the file when it defines none such)."""
    found = _file(name, headers)
    if const not in found:
        raise KeyError(f"kernels/{name} defines no integer constant {const}; it defines {', '.join(sorted(found))}")
    return found[const]


@functools.cache
def macro_calls(name: str, macro: str) -> dict[str, dict[str, str]]:
    """Each line of kernels/`name` that invokes the function-like `macro` at its start, by its first
    argument (an entry's name): the other arguments as written, by the macro's parameter names."""
    text = (kernels_dir() / name).read_text()
    # (a definition may run over lines: their continuation backslashes are not part of a name)
    params = [p.strip() for p in re.search(rf"#define {macro}\(([^)]*)\)", text).group(1).replace("\\", " ").split(",")]
    calls = {}
    for m in re.finditer(rf"^{macro}\(([^)]*)\)", text, re.M):
        args = [a.strip() for a in m.group(1).split(",")]
        calls[args[0]] = dict(zip(params[1:], args[1:], strict=True))
    return calls
