"""What a page shows of a kernel's source and binary: its own constants, its diff from the last
chapter's kernel, its SASS (whole, by function, by opcode), its named barriers, and the resident
blocks its registers and shared memory allow. Needs nvcc and cuobjdump for the SASS, not a GPU.
"""
from __future__ import annotations

from ..kernels import registry


def kernel_constant(source: str, name: str) -> int:
    """`constexpr int NAME = value;` read from kernels/`source`, so that a page quotes the kernel's
    own number rather than a copy of it."""
    import re

    from ..paths import kernels_dir

    found = re.search(rf"constexpr int {name} = (\d+);", (kernels_dir() / source).read_text())
    if found is None:
        raise KeyError(f"kernels/{source} defines no `constexpr int {name} = ...;`")
    return int(found.group(1))


def source_diff(old: str, new: str, context: int = 3, new_dir=None, new_label: str | None = None) -> str:
    """Show the unified diff from kernels/`old` to kernels/`new` (or to `new` in `new_dir`, a
    scratch copy, named `new_label`) in the page as a highlighted block and return its text. The
    file names are relative to the repository, so the output is the same on every machine."""
    import difflib
    from pathlib import Path

    from IPython.display import Markdown, display

    from ..paths import kernels_dir

    a = (kernels_dir() / old).read_text().splitlines(keepends=True)
    b = (Path(new_dir or kernels_dir()) / new).read_text().splitlines(keepends=True)
    label = new_label or f"kernels/{new}"
    text = "".join(difflib.unified_diff(a, b, f"kernels/{old}", label, n=context))
    display(Markdown(f"````diff\n{text}````"))
    return text


def count_ops(counts: dict[str, int], *prefixes: str) -> int:
    """How many instructions of `counts` (opcode -> count) start with one of the prefixes:
    count_ops(c, "LDG.E.128") counts LDG.E.128 and LDG.E.128.CONSTANT."""
    return sum(n for op, n in counts.items() if any(op == p or op.startswith(p + ".") for p in prefixes))


def sass_lines(kernel_id: str, arch: str, *prefixes: str) -> list[str]:
    """The SASS instructions of the kernel's nvcc build for `arch` whose opcode starts with one of
    `prefixes` (all of them when none is given), in program order, as `/*offset*/ OPCODE operands`
    without the encoding. Offsets and registers move between toolkits; opcodes and immediates
    (barrier ids, thread counts) do not."""
    import re

    from ..kernels.static import build

    text = build(registry.get(kernel_id, arch), arch).sass
    line_re = re.compile(r"(/\*[0-9a-f]{4,}\*/)\s+((?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)[^;]*;)")
    out = []
    for m in line_re.finditer(text):
        if not prefixes or any(m.group(3) == p or m.group(3).startswith(p + ".") for p in prefixes):
            out.append(f"{m.group(1)} {' '.join(m.group(2).split())}")
    return out


def sass_lines_by_function(kernel_id: str, arch: str) -> dict[str, list[str]]:
    """The SASS of each function in the kernel's nvcc build for `arch` (cuobjdump), one
    instruction a line with its operands, e.g. "DEPBAR.LE SB0, 0x1"."""
    from ..kernels.static import build, sass_by_function

    return sass_by_function(build(registry.get(kernel_id, arch), arch).sass)


def sass_by_function(kernel_id: str, arch: str) -> dict:
    """Opcode counts (full opcode with modifiers, e.g. HMMA.16816.F32) of each function in the
    kernel's nvcc build for `arch`, from cuobjdump; predicates are dropped, never-executed padding
    (@!PT) is not counted. The loop bodies appear once: these are instructions in the binary, not
    instructions executed."""
    from ..kernels.static import function_opcodes

    return {name: function_opcodes(lines) for name, lines in sass_lines_by_function(kernel_id, arch).items()}


def named_barriers(lines: list[str]) -> list[tuple[str, int, int | None]]:
    """(SYNC or ARV, barrier id, thread count or None) of each BAR.SYNC / BAR.ARV in SASS lines
    with immediate operands (`BAR.SYNC.DEFER_BLOCKING 0x1, 0xa0`: barrier 1, 160 threads)."""
    from ..kernels import static

    return static.named_barriers("\n".join(lines))


def blocks_per_sm(arch: str, registers: int, smem_bytes: int, threads: int) -> tuple[int, str]:
    """Resident blocks per SM and what limits them ("shared memory", "registers and shared
    memory", ...), by attnlab.gpus.occupancy."""
    from ..gpus import occupancy

    occ = occupancy(arch, threads, registers, smem_bytes)
    return occ.blocks_per_sm, " and ".join(occ.limiters)
