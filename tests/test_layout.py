"""The package's layout is its architecture: every module sits in one wing, a wing imports only
itself, the ground and the wings attnlab.WINGS lists for it, and no import loop exists anywhere,
counting the imports inside functions. Each wing's __init__ says the same in words."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attnlab

SRC = Path(attnlab.__file__).resolve().parent
TOP = "top"  # attnlab/__init__.py, __main__.py and cli.py: above every wing


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The attnlab modules `name` imports, wherever the import stands (top level or in a function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "attnlab"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            if origin.split(".")[0] != "attnlab":
                continue
            # `from ..kernels import registry` imports the module attnlab.kernels.registry
            subs = {f"{origin}.{a.name}" for a in node.names} & known
            out |= subs or {origin}
    return {m for m in out if m != name}


def wing_of(module: str, wings) -> str:
    parts = module.split(".")
    if module == "attnlab" or parts[1] in ("cli", "__main__", "cpu"):
        return TOP
    if len(parts) == 2 and parts[1] not in wings:
        return "ground"
    return parts[1]


def layering_problems(edges: dict[str, set[str]], wings: dict[str, tuple[str, ...]]) -> list[str]:
    """Every import that leaves its wing for one the wing may not import."""
    problems = []
    for a, targets in sorted(edges.items()):
        wa = wing_of(a, wings)
        if wa not in wings and wa != TOP:
            problems.append(f"{a} is in no declared wing ({wa})")
            continue
        for b in sorted(targets):
            wb = wing_of(b, wings)
            if wa == TOP or wb == wa:
                continue
            if wb == TOP or wb not in wings[wa]:
                problems.append(f"{a} ({wa}) imports {b} ({wb}), which {wa} may not import")
    return problems


def import_loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan), each an import loop."""
    index, low, stack, on_stack, loops = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                loops.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return loops


def package_edges() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def test_every_wing_is_a_folder_of_the_package_and_every_folder_a_wing():
    folders = {p.parent.name for p in SRC.glob("*/__init__.py")}
    assert folders == set(attnlab.WINGS) - {"ground"}


def test_no_wing_imports_one_it_may_not():
    assert layering_problems(package_edges(), attnlab.WINGS) == []


def test_no_import_loop_anywhere_in_the_package():
    assert import_loops(package_edges()) == []


def test_the_checks_catch_a_loop_and_an_import_upward():
    """The two checks above can fail: a planted loop and a planted upward import are found."""
    edges = {"attnlab.kernels.registry": {"attnlab.gpu.launch"}, "attnlab.gpu.launch": {"attnlab.kernels.registry"},
             "attnlab.shapes": {"attnlab.book.page"}, "attnlab.book.page": set()}
    assert import_loops(edges) == [["attnlab.gpu.launch", "attnlab.kernels.registry"]]
    assert layering_problems(edges, attnlab.WINGS) == [
        "attnlab.kernels.registry (kernels) imports attnlab.gpu.launch (gpu), which kernels may not import",
        "attnlab.shapes (ground) imports attnlab.book.page (book), which ground may not import"]


def test_the_imports_the_checks_read_include_those_inside_functions():
    edges = package_edges()
    # cli imports the executor only inside its commands; physics reads the timing statistics there
    assert "attnlab.executor.cpu" in edges["attnlab.cli"]
    assert "attnlab.records.timing" in edges["attnlab.records.physics"]


def test_the_wings_are_declared_in_an_order_each_imports_only_below():
    """WINGS reads bottom up: a wing lists only wings declared before it."""
    order = list(attnlab.WINGS)
    for wing, below in attnlab.WINGS.items():
        assert all(order.index(b) < order.index(wing) for b in below), wing


# ids "gpu_wing", not "gpu": a test id "gpu" would read as the gpu marker and be skipped without a GPU
@pytest.mark.parametrize("wing", [w for w in attnlab.WINGS if w != "ground"], ids=lambda w: f"{w}_wing")
def test_each_wing_says_what_it_is_for_and_what_it_must_not_import(wing):
    """The __init__ of a wing: what it is for, then one paragraph naming the wings it imports and,
    after "never", every wing it must not import. It hands on no names but a reader's own calls
    (attnlab.exercises.check), each named in the docstring and in __all__ and importing its module
    only when called: importing a wing imports nothing more."""
    path = SRC / wing / "__init__.py"
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    assert doc, f"{path} says what the wing is for"
    rest = tree.body[1:]
    public = next((ast.literal_eval(n.value) for n in rest if isinstance(n, ast.Assign)
                   and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__all__"]), [])
    for node in rest:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        assert isinstance(node, ast.FunctionDef), f"{path} holds its docstring and a reader's calls alone"
        assert node.name in public and f"{node.name}(" in doc, f"{path}: {node.name} is public and documented"
    rule = doc.split("\n\n")[-1]
    allowed, _, forbidden = rule.partition("never")
    assert forbidden, f"{wing}'s __init__ names what it must never import"
    for other in attnlab.WINGS:
        if other != wing:
            assert other in (allowed if other in attnlab.WINGS[wing] else forbidden), (wing, other)


def test_every_attnlab_import_and_module_run_written_outside_python_resolves():
    """The shell scripts and docs name modules too (`python -m attnlab.session.stages`, `-c 'from
    attnlab.kernels import toolchain'`): each must still resolve after a module moves."""
    import importlib
    import importlib.util
    import re

    root = SRC.parents[1]
    texts = {p: p.read_text() for p in [root / "README.md", *(root / "scripts").glob("*.sh"),
                                        *(root / "scripts").glob("*.md"), root / "book" / "running.md"]}
    missing = []
    for path, text in texts.items():
        for module, names in re.findall(r"from (attnlab[\w.]*) import ([\w, ]+)", text):
            for name in (n.strip() for n in names.split(",") if n.strip()):
                try:
                    mod = importlib.import_module(module)
                    if not hasattr(mod, name):
                        importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{path.name}: from {module} import {name}")
        for module in re.findall(r"-m (attnlab[\w.]*)", text):
            if importlib.util.find_spec(module) is None:
                missing.append(f"{path.name}: python -m {module}")
    assert missing == []
