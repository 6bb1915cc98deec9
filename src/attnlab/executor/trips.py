"""Which basic blocks of a kernel's CPU build hold which source lines of which loops, so the runtime
can count on how many trips of each loop each line ran (runtime/trips.cpp).

The kernel's translation unit calls __sanitizer_cov_trace_pc at the top of every basic block
(build.py's -fsanitize-coverage=trace-pc); the call's return address names the block. objdump
lists those calls and the instructions after each, up to the next; addr2line gives each
instruction its source line with the lines it was inlined at. A `for` statement of a kernel
source spans its own line to the end of its body (read from the source, braces matched); a block
ends a trip of the loop when one of its instructions comes from the `for` line itself, with no
kernel line inlined below it: the loop's own test and increment, which run once per trip, and its
entry test. A block records a trip of each line inside a loop's body that its code comes from (at
any depth of inlining), unless it ends that loop's trips: the loop's entry, where the host compiler
hoists what the body computes once, and its latch. A line runs on a trip when any block recording
it ran.

Only the blocks an entry point can reach are given to the runtime: those of its function and of the
kernel functions it calls.
"""
from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..paths import kernels_dir
from .build import ExecutorUnavailable, frames_at

HOOK = "__sanitizer_cov_trace_pc"
_FUNCTION = re.compile(r"^([0-9a-f]+) <(.+)>:$")
_INSTRUCTION = re.compile(r"^\s+([0-9a-f]+):\s+(\S+)(?:\s+(.*))?$")
_CALL_TARGET = re.compile(r"<([^+>]+)>")


@dataclass(frozen=True)
class EntryBlocks:
    """The basic blocks one entry point can reach, the loops they end trips of, and the (line, loop)
    pairs whose trips they record."""
    offsets: tuple[int, ...]                   # each block's return address, as a module offset
    loops: tuple[str, ...]                     # each counted loop's `for` line, "file:line"
    ends: tuple[tuple[int, ...], ...]          # per block, the loops whose trips it ends
    pairs: tuple[tuple[str, int], ...]         # ("file:line" inside a loop's body, that loop)
    records: tuple[tuple[int, ...], ...]       # per block, the pairs it records a trip of

    def pair(self, line: str, loop: str) -> int | None:
        """The index of (line, loop) among the pairs, or None: the executor counted no trip of
        that line in that loop (its code lies only in the loop's entry and latch, or nowhere)."""
        if loop not in self.loops:
            return None
        try:
            return self.pairs.index((line, self.loops.index(loop)))
        except ValueError:
            return None


def _functions(disassembly: str) -> dict[str, list[tuple[int, str, str]]]:
    """Per function of objdump's listing: its (address, mnemonic, operands), in order."""
    out: dict[str, list[tuple[int, str, str]]] = {}
    current = None
    for line in disassembly.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = out.setdefault(m.group(2), [])
            current.append((int(m.group(1), 16), "", ""))  # the symbol's own address
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2), m.group(3) or ""))
    return out


def _kernel_file(path: str) -> str | None:
    """The kernel source a debug-information path names (file name only: a library is cached by
    content and may have been built from another checkout), or None for the executor's own files,
    system headers and the build's wrapper."""
    name = Path(path).name
    return name if name.endswith((".cu", ".cuh")) and "/executor/" not in path.replace("\\", "/") else None


def _chains(library: Path, addresses: list[int]) -> dict[int, list[tuple[str, int]]]:
    """address -> its kernel frames, innermost first, as (file, line), by addr2line."""
    frames = frames_at(library, addresses)
    if frames is None:
        raise ExecutorUnavailable("counting trips needs addr2line (binutils), which is not on PATH")
    out: dict[int, list[tuple[str, int]]] = {}
    for address, chain in frames.items():
        out[address] = []
        for frame in chain:
            path, _, number = frame.rpartition(":")
            if (name := _kernel_file(path)) and number.isdigit() and int(number) > 0:
                out[address].append((name, int(number)))
    return out


# ---- `for` statements of a source, with the last line of each ----------------------------------

def _code(text: str) -> str:
    """The source with comments, string and character literals and preprocessor lines blanked
    (newlines kept, so offsets keep their lines)."""
    out, i, n = [], 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#" or text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            while c == "#" and text[j - 1:j] == "\\" and j < n:  # a continued directive
                j = text.find("\n", j + 1)
                j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j, n - 1) + 1 - i))
            i = j + 1
            continue
        out.append(c)
        at_line_start = c == "\n" or (at_line_start and c in " \t")
        i += 1
    return "".join(out)


def _matching(code: str, i: int, open_: str, close: str) -> int:
    """The offset of the `close` that matches the `open_` at i."""
    depth = 0
    for j in range(i, len(code)):
        if code[j] == open_:
            depth += 1
        elif code[j] == close:
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


_KEYWORD = re.compile(r"\s*(for|while|if|switch)\s*\(|\s*(else|do)\b|\s*\{")


def _statement_end(code: str, i: int) -> int:
    """The offset of the last character of the statement that starts at or after i."""
    m = _KEYWORD.match(code, i)
    if m is None or (m.group(0).strip() == "" and not m.group(1)):
        j = code.find(";", i)
        return len(code) - 1 if j < 0 else j
    if m.group(0).strip() == "{":
        return _matching(code, m.end() - 1, "{", "}")
    if m.group(1):
        end = _statement_end(code, _matching(code, m.end() - 1, "(", ")") + 1)
        if m.group(1) == "if":
            after = re.match(r"\s*else\b", code[end + 1:])
            if after:
                end = _statement_end(code, end + 1 + after.end())
        return end
    if m.group(2) == "else":
        return _statement_end(code, m.end())
    body = _statement_end(code, m.end())  # do body while (...);
    j = code.find(";", body + 1)
    return len(code) - 1 if j < 0 else j


@functools.lru_cache(maxsize=None)
def for_statements(text: str) -> tuple[tuple[int, int], ...]:
    """(line of the `for`, last line of its body) for every `for` statement of a C++ source."""
    code = _code(text)
    out = []
    for m in re.finditer(r"\bfor\s*\(", code):
        close = _matching(code, m.end() - 1, "(", ")")
        end = _statement_end(code, close + 1)
        out.append((code.count("\n", 0, m.start()) + 1, code.count("\n", 0, end) + 1))
    return tuple(out)


def _source(name: str, src_dir: Path | None) -> str | None:
    for folder in (src_dir, kernels_dir()):
        if folder is not None and (Path(folder) / name).is_file():
            return (Path(folder) / name).read_text()
    return None


# ---- one library's blocks ------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def entry_blocks(library: Path, entry: str, src_dir: Path | None = None) -> EntryBlocks:
    """The blocks of `library` that entry point `entry` reaches (its function and the kernel
    functions it calls), with the loops each lies in and ends trips of."""
    proc = subprocess.run([shutil.which("objdump") or "objdump", "-d", "--no-show-raw-insn", str(library)],
                          capture_output=True, text=True, check=True)
    functions = _functions(proc.stdout)
    if entry not in functions:
        return EntryBlocks((), (), (), (), ())
    begin = functions.get("attn_cpu_kernel_text_begin", [(0, "", "")])[0][0]
    end = functions.get("attn_cpu_kernel_text_end", [(1 << 62, "", "")])[0][0]
    reach, todo = [], [entry]
    while todo:
        name = todo.pop()
        if name in reach or name not in functions or not begin <= functions[name][0][0] < end:
            continue
        reach.append(name)
        for _, mnemonic, operands in functions[name]:
            m = _CALL_TARGET.search(operands) if mnemonic.startswith("call") else None
            if m and m.group(1) != HOOK:
                todo.append(m.group(1))
    # Blocks: each hook call's return address, with the instructions from there to the next call.
    blocks: list[tuple[int, list[int]]] = []
    for name in reach:
        body = functions[name][1:]
        for k, (address, mnemonic, operands) in enumerate(body):
            if mnemonic.startswith("call") and f"<{HOOK}>" in operands and k + 1 < len(body):
                blocks.append((body[k + 1][0], []))
            elif blocks and blocks[-1][0] <= address:
                blocks[-1][1].append(address)
    chains = _chains(library, sorted({a for _, addresses in blocks for a in addresses}))
    # The `for` statements of every kernel file a block's code came from.
    files = sorted({f for _, addresses in blocks for a in addresses for f, _ in chains.get(a, [])})
    statements = {f: for_statements(text) for f in files if (text := _source(f, src_dir)) is not None}
    loops = [f"{f}:{line}" for f in files for line, _ in statements.get(f, ())]
    loop_id = {loop: i for i, loop in enumerate(loops)}
    pairs: dict[tuple[str, int], int] = {}
    offsets, ends, records = [], [], []
    for offset, addresses in blocks:
        seen = [chains.get(a, []) for a in addresses]
        mine = tuple(sorted({loop_id[f"{chain[0][0]}:{chain[0][1]}"] for chain in seen
                             if chain and f"{chain[0][0]}:{chain[0][1]}" in loop_id}))
        # The lines inside a loop's body whose code this block holds, where the block is not the
        # loop's own entry or latch: the host compiler hoists there what the body computes once.
        held = sorted({(f"{f}:{line}", loop_id[f"{f}:{first}"]) for chain in seen for f, line in chain
                       for first, last in statements.get(f, ()) if first < line <= last})
        offsets.append(offset)
        ends.append(mine)
        records.append(tuple(pairs.setdefault((line, h), len(pairs)) for line, h in held if h not in mine))
    return EntryBlocks(tuple(offsets), tuple(loops), tuple(ends), tuple(pairs), tuple(records))
