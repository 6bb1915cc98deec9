"""A reader's kernel source, found and built for the CPU executor: its `__global__` functions and
their parameters read from the text (for the messages, and to pick the entry), the source copied
into a folder named by its content under the cache (cache_dir()/cpu/reader/<hash>/, keeping the
file's own name, so findings say `my_add.cu:12`) and built once by build_library; a second run of
the same source loads the cached library. Plain `__global__` functions only: template kernels and
overloaded names are out of scope (a non-template wrapper that calls a `__device__` template is
the way in). attnlab.executor.reader runs what this builds.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..paths import cache_dir
from .build import ExecutorBuildError
from .library import Library, load

# Signature letters (include/attn_cpu/thunk.h) of scalar parameters: the C type and its NumPy dtype.
SCALARS: dict[str, tuple[str, type]] = {
    "b": ("bool", np.bool_), "c": ("char", np.int8), "C": ("unsigned char", np.uint8),
    "s": ("short", np.int16), "S": ("unsigned short", np.uint16),
    "i": ("int", np.int32), "u": ("unsigned", np.uint32),
    "l": ("long long", np.int64), "L": ("unsigned long long", np.uint64),
    "h": ("__half", np.float16), "f": ("float", np.float32), "d": ("double", np.float64),
}
POINTERS = ("p", "P")  # P: pointer to const (read-only: never copied back)

# What an array passed for `T*` may hold, for the pointee types whose size and kind are known.
POINTEE_DTYPES: dict[str, tuple[str, ...]] = {}
for _names, _dtypes in (
        (("float", "float2", "float4"), ("float32",)),
        (("double",), ("float64",)),
        (("int", "signed", "signed int", "int32_t", "int2", "int4"), ("int32",)),
        (("unsigned", "unsigned int", "uint32_t", "uint2", "uint4"), ("uint32",)),
        (("long long", "long long int", "int64_t", "long"), ("int64",)),
        (("unsigned long long", "unsigned long long int", "uint64_t", "unsigned long", "size_t"), ("uint64",)),
        (("short", "short int", "int16_t"), ("int16",)),
        (("unsigned short", "unsigned short int", "uint16_t"), ("uint16",)),
        (("char", "signed char", "int8_t"), ("int8", "uint8", "bool")),
        (("unsigned char", "uint8_t"), ("uint8", "int8", "bool")),
        (("bool",), ("bool", "uint8", "int8")),
        (("half", "__half", "half2", "__half2"), ("float16", "uint16", "int16")),
        (("__nv_bfloat16", "nv_bfloat16", "__nv_bfloat162"), ("uint16", "int16")),  # torch bfloat16 arrives as int16
):
    for _n in _names:
        POINTEE_DTYPES[_n] = _dtypes

# Headers of the CUDA toolkit that declare what the executor's prelude already provides: their
# #include lines are blanked in the built copy (line numbers unchanged).
_TOOLKIT_HEADERS = ("cuda_runtime.h", "cuda_runtime_api.h", "cuda.h", "device_launch_parameters.h",
                    "device_functions.h", "cuda_device_runtime_api.h")


class ReaderError(ValueError):
    """The reader's kernel cannot run as asked: no such entry, a wrong argument, a bad launch
    configuration. The first line of the message says what and where."""


class ReaderBuildError(ReaderError):
    """The host compiler rejected the reader's kernel; the first line is its first error
    (file:line: error: ...), the next lines the compiler's own."""


# ---- the source: kernels and their parameters -----------------------------------------------

@dataclass(frozen=True)
class Param:
    name: str
    decl: str              # as written, whitespace collapsed: "const float* __restrict__ a"
    type: str              # the type alone: "const float*"
    pointer: bool
    const_pointee: bool    # a pointer to const (the kernel only reads through it)
    pointee: str           # the pointed-to type without qualifiers ("float"), "" for a scalar


@dataclass(frozen=True)
class KernelDecl:
    name: str
    line: int
    params: tuple[Param, ...]
    template: bool
    defined: bool          # a body follows (not only a declaration)


_BLANKS = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
_KERNEL = re.compile(r"\b__global__\b((?:\s+(?:__launch_bounds__\s*\([^()]*\)|[A-Za-z_]\w*))*?)\s*\(")
_WORD = re.compile(r"[A-Za-z_]\w*")
# Words that end a type, not name a parameter: `int` alone, `const float` alone are unnamed.
_TYPE_WORDS = frozenset("bool char short int long unsigned signed float double half __half void const volatile".split())


def _blank(text: str) -> str:
    """`text` with comments and the insides of string and character literals as spaces (newlines
    kept), so offsets and line numbers stay those of the source."""
    def repl(m):
        s = m.group(0)
        if s[0] in "\"'":
            return s[0] + re.sub(r"[^\n]", " ", s[1:-1]) + s[-1]
        return re.sub(r"[^\n]", " ", s)
    return _BLANKS.sub(repl, text)


def _closing(text: str, start: int) -> int:
    """The index of the ")" closing the "(" at `start` (len(text) when unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return len(text)


def _split_params(inside: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in inside:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _param(text: str, index: int) -> Param:
    decl = " ".join(text.split())
    body = decl.split("=")[0].strip()                       # a default value is no part of the type
    body = re.sub(r"\b(__restrict__|__restrict|restrict)\b", " ", body)
    array = re.search(r"\[[^\]]*\]\s*$", body)  # `float a[]`: a pointer
    if array:
        body = body[:array.start()].strip()
    m = re.search(r"([A-Za-z_]\w*)\s*$", body)
    type_text = body[:m.start()].strip() if m else body
    if array:
        type_text, body = type_text + "*", body + "*"
    qualifiers = ("const", "volatile", "struct")
    if not m or m.group(1) in _TYPE_WORDS or not [w for w in _WORD.findall(type_text) if w not in qualifiers]:
        name, type_text = f"arg{index + 1}", body                # unnamed ("int", "float*")
    else:
        name = m.group(1)
    type_text = " ".join(type_text.replace("*", " * ").replace("&", " & ").split()).replace(" *", "*")
    pointer = "*" in type_text
    head = type_text[:type_text.rfind("*")] if pointer else ""
    const_pointee = pointer and re.search(r"\bconst\b", head) is not None
    pointee = " ".join(w for w in head.replace("*", " ").split() if w not in ("const", "volatile", "struct")) \
        if pointer and type_text.count("*") == 1 else ""
    return Param(name, decl, type_text, pointer, const_pointee, pointee)


def find_kernels(text: str) -> list[KernelDecl]:
    """Every `__global__` function of `text` in source order (declarations and definitions), with
    its parameters as written. Comments and string literals are ignored; the preprocessor is not
    run (a kernel made by a macro is not found)."""
    plain = _blank(text)
    out = []
    for m in _KERNEL.finditer(plain):
        words = re.findall(r"__launch_bounds__\s*\([^()]*\)|[A-Za-z_]\w*", m.group(1))
        if len(words) < 2 or words[-1].startswith("__launch_bounds__"):
            continue  # `__global__ void (` or no name: not a kernel we can read
        name = words[-1]
        close = _closing(plain, m.end() - 1)
        inside = plain[m.end():close]
        params = tuple(_param(p, i) for i, p in enumerate(_split_params(inside)) if p and p != "void")
        before = plain[:m.start()]
        cut = max(before.rfind(";"), before.rfind("}"), before.rfind("{"))
        template = re.search(r"\btemplate\s*<", before[cut + 1:]) is not None
        after = plain[close + 1:].lstrip()
        out.append(KernelDecl(name, plain.count("\n", 0, m.start()) + 1, params, template,
                              defined=after.startswith("{")))
    return out


def choose_entry(kernels: list[KernelDecl], entry: str | None, filename: str) -> KernelDecl:
    """The kernel to run: the one named `entry`, else the file's only (non-template) kernel; a
    ReaderError saying why not otherwise."""
    defined: dict[str, list[KernelDecl]] = {}
    for k in kernels:
        defined.setdefault(k.name, [])
        if k.defined:
            defined[k.name].append(k)
    runnable = [n for n, ks in defined.items() if ks and not any(k.template for k in ks)]
    if entry is None:
        if not defined:
            raise ReaderError(f"{filename}: no __global__ function found (the CPU runner runs a file's kernels; "
                              "a kernel made by a macro is not seen)")
        if len(runnable) == 1:
            entry = runnable[0]
        elif not runnable:
            name = next(iter(defined))
            return choose_entry(kernels, name, filename)  # says why that one cannot run
        else:
            raise ReaderError(f"{filename} has {len(runnable)} kernels ({', '.join(runnable)}): name the one "
                              "to run (entry=..., --entry NAME, or the magic's first word)")
    if entry not in defined:
        import difflib

        close = difflib.get_close_matches(entry, list(defined), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        known = ", ".join(defined) or "none"
        raise ReaderError(f"{filename}: no __global__ function named {entry!r}; {hint}its kernels: {known}")
    ks = defined[entry]
    if not ks:
        raise ReaderError(f"{filename}: {entry} is declared but not defined in this file (the CPU runner builds "
                          "the file alone)")
    if any(k.template for k in ks):
        raise ReaderError(f"{filename}:{ks[0].line}: {entry} is a template kernel; the CPU runner takes plain "
                          "__global__ functions (templates and overloads are out of scope): make the template "
                          f"a __device__ function and call it from a plain `__global__ void {entry}_float(...)`")
    if len(ks) > 1:
        lines = ", ".join(str(k.line) for k in ks)
        raise ReaderError(f"{filename}: {entry} is overloaded (lines {lines}); the CPU runner takes one plain "
                          "__global__ function per name (templates and overloads are out of scope): rename one")
    return ks[0]


# ---- the build --------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"/\\]+\.cuh)"', re.M)
_TOOLKIT_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"](%s)[>\"][^\n]*" %
                              "|".join(re.escape(h) for h in _TOOLKIT_HEADERS), re.M)


@dataclass(frozen=True)
class Source:
    text: str
    filename: str          # the name findings and errors show ("vadd.cu", "cell.cu")
    shown: str             # how errors name the file: the path as given, or the name
    headers: tuple[tuple[str, str], ...] = ()  # (name, text) of .cuh files next to it that it includes


def _is_path(obj) -> bool:
    if isinstance(obj, os.PathLike):
        return True
    if not isinstance(obj, str) or "\n" in obj or "__global__" in obj:
        return False
    return obj.endswith((".cu", ".cuh")) or Path(obj).is_file()


def read_source(source_or_path, name: str | None = None) -> Source:
    """The reader's source: a path to a .cu file, or CUDA source text (named `name`, default "cell.cu")."""
    if _is_path(source_or_path):
        path = Path(source_or_path).expanduser()
        if not path.is_file():
            raise ReaderError(f"{path}: no such file")
        if path.suffix not in (".cu", ".cuh"):
            raise ReaderError(f"{path}: the CPU runner builds .cu files (rename it, or pass its text)")
        filename = name or path.name
        text = path.read_text()
        headers, seen, todo = [], set(), [text]
        while todo:  # .cuh files next to it that it (or they) include by a plain quoted name
            for inc in _QUOTED_INCLUDE.findall(todo.pop()):
                f = path.parent / inc
                if inc not in seen and inc != filename and f.is_file():
                    seen.add(inc)
                    headers.append((inc, f.read_text()))
                    todo.append(headers[-1][1])
        shown = str(source_or_path)
    elif isinstance(source_or_path, str):
        text, filename, headers = source_or_path, name or "cell.cu", []
        if not filename.endswith((".cu", ".cuh")):
            filename += ".cu"
        shown = filename
    else:
        raise ReaderError(f"the kernel must be a path to a .cu file or CUDA source text, not {type(source_or_path).__name__}")
    if not filename.endswith((".cu", ".cuh")):
        filename += ".cu"
    if not _NAME.fullmatch(filename):
        raise ReaderError(f"{filename!r}: a kernel file name of letters, digits and _ . + - only")
    return Source(text, filename, shown, tuple(headers))


def source_dir(src: Source) -> Path:
    """The content-addressed folder holding the source (and the headers it includes) as built."""
    h = hashlib.sha256()
    for fname, text in ((src.filename, src.text), *sorted(src.headers)):
        h.update(fname.encode() + b"\0" + text.encode() + b"\0")
    folder = cache_dir() / "cpu" / "reader" / h.hexdigest()[:20]
    for fname, text in ((src.filename, src.text), *src.headers):
        # the toolkit's runtime headers declare what the prelude provides: blanked, lines kept
        data = _TOOLKIT_INCLUDE.sub(lambda m: "// " + m.group(0).strip(), text).encode()
        target = folder / fname
        if target.exists() and target.read_bytes() == data:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".write-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    return folder


def _compiler_message(log: str, folder: Path, src: Source) -> str:
    """The compiler's first error, with the reader's file:line, and a few lines after it."""
    head, _, body = log.partition("\n")
    names = {str(folder / f): (src.shown if f == src.filename else f) for f, _ in ((src.filename, ""), *src.headers)}
    for full, short in sorted(names.items(), key=lambda kv: -len(kv[0])):
        body = body.replace(full, short)
    body = body.replace(str(folder) + os.sep, "")
    lines = [ln for ln in body.splitlines() if ln.strip() and not ln.startswith(("In file included from", "                 from"))]
    first = next((i for i, ln in enumerate(lines) if re.search(r"\b(fatal )?error\b|undefined reference", ln)), None)
    what = "linking" if head.startswith("linking") else "compiling"
    if first is None:
        shown = lines[:8]
        line1 = f"{what} {src.filename} for the CPU executor failed"
    else:
        line1 = f"{what} {src.filename} for the CPU executor failed: {lines[first].strip()}"
        shown = lines[first + 1:first + 8]
    n_errors = sum(1 for ln in lines if re.search(r": (fatal )?error:", ln))
    text = "\n".join([line1, *shown])
    if n_errors > 1:
        text += f"\n({n_errors} errors in all; the first is above)"
    low = body.lower()
    if "attn_cpu_unsupported_shared_declaration" in low:
        text += ("\nhint: a __shared__ declaration of a form the executor does not rewrite: it takes "
                 "`__shared__ T a[N][M], x;` and `extern __shared__ T name[];`, each on one line up to its `;`")
    if re.search(r"\bcuda(malloc|memcpy|free|devicesynchronize|getlasterror|error_t|stream)", low) or "<<<" in body:
        text += ("\nhint: the CPU runner builds the file's kernels, not host code: keep main(), cudaMalloc and "
                 "<<<...>>> launches under `#ifndef ATTN_CPU` (the executor defines ATTN_CPU)")
    return text


def _load_message(error: str, src: Source) -> str:
    m = re.search(r"undefined symbol: (\S+)", error)
    if not m:
        return f"loading {src.filename}'s library failed: {error}"
    symbol = m.group(1)
    tool = shutil.which("c++filt")
    if tool:
        symbol = subprocess.run([tool, symbol], capture_output=True, text=True, check=False).stdout.strip() or symbol
    return (f"loading {src.filename} for the CPU executor failed: {symbol} is used but defined nowhere "
            "(a __device__ function declared without a body, or one from a library the executor does not have)")


@dataclass
class ReaderKernel:
    """One built entry of a reader's source: its library, signature letters and parameters."""
    source: Source
    entry: KernelDecl
    library: Library
    signature: str

    @property
    def name(self) -> str:
        return self.entry.name

    def params(self) -> list[Param]:
        """The parameters as the source declares them; where the source's text and the built
        signature disagree in count (a macro in the list), placeholders named arg1, arg2, ..."""
        ps = list(self.entry.params)
        if len(ps) != len(self.signature):
            ps = [Param(f"arg{i + 1}", "?", "?", c in POINTERS, c == "P", "") for i, c in enumerate(self.signature)]
        return ps

    def declaration(self) -> str:
        return f"{self.name}({', '.join(p.decl for p in self.params())})"


# What the executor cannot run, found in the reader's own text before any build: one line each,
# rather than a host compiler's error about something else, or a run that answers wrong.
_UNSUPPORTED = (
    (re.compile(r"\basm\b|\b__asm__\b"), "inline PTX (asm)",
     "the executor runs CUDA C++, not PTX: use the intrinsics (__shfl_sync, ...) or kernels/ptx.cuh's wrappers "
     "(attn::ldsm_x4, attn::mma_16816, attn::cp_async_16, attn::bar_sync)"),
    (re.compile(r"\bcooperative_groups\b|\bcg::"), "cooperative groups",
     "not modelled: use __syncthreads, __syncwarp and the *_sync warp intrinsics"),
    (re.compile(r"\b__syncthreads_(?:count|and|or)\b"), "__syncthreads_count/and/or",
     "not modelled: count with a shared counter and atomicAdd, then __syncthreads"),
    (re.compile(r"\btex[123]D\w*|\btexture\s*<|\bsurf[123]D\w*|\bcudaTextureObject_t\b"), "textures and surfaces",
     "not modelled: read the array through a plain (const) pointer"),
    (re.compile(r"\bclock(?:64)?\s*\(\s*\)|\b__nanosleep\b|\b__globaltimer\b"), "a GPU clock",
     "the executor never times a kernel: its clocks would mean nothing"),
    (re.compile(r"\b__constant__\b"), "__constant__ memory",
     "the host fills it (cudaMemcpyToSymbol), which a kernel file alone cannot: pass the values as a kernel "
     "argument (a pointer to const), or write a __device__ const table with its values in the source"),
    (re.compile(r"\b(?:malloc|free)\s*\(|\bnew\s+[A-Za-z_]|\bdelete\b"), "a device heap (malloc, free, new, delete)",
     "the executor keeps no global memory beside the launch's buffers: pass a scratch buffer as a kernel argument"),
    # A variable, not a function: no parenthesis before its `=` or `;`; a const table is fine.
    (re.compile(r"(?m)^[ \t]*(?:static[ \t]+)?__(?:device|managed)__\b(?![^;(){}\n]*\bconst\b)[^;(){}\n]*[=;]"),
     "a __device__ (or __managed__) variable",
     "the executor keeps no global memory beside the launch's buffers: pass the array as a kernel argument "
     "(a __device__ const table with its values in the source is fine)"),
)


def unsupported(text: str, shown: str) -> str | None:
    """The first construct in `text` (comments and strings aside) the executor cannot run, as one
    line naming it and its place; None when there is none."""
    blank = _blank(text)
    for pattern, what, why in _UNSUPPORTED:
        m = pattern.search(blank)
        if m:
            line = blank.count("\n", 0, m.start()) + 1
            return f"{shown}:{line}: {what} is not something the CPU executor runs: {why}"
    return None


def build(source_or_path, entry: str | None = None, *, name: str | None = None) -> ReaderKernel:
    """Build (or load from the cache) the kernel `entry` of a reader's source."""
    src = read_source(source_or_path, name)
    refusal = unsupported(src.text, src.shown)
    if refusal:
        raise ReaderError(refusal)
    decl = choose_entry(find_kernels(src.text), entry, src.shown)
    folder = source_dir(src)
    try:
        lib = load(src.filename, [decl.name], src_dir=folder)
    except ExecutorBuildError as exc:
        raise ReaderBuildError(_compiler_message(str(exc), folder, src)) from None
    except OSError as exc:  # the library links, but a symbol it uses is defined nowhere
        raise ReaderBuildError(_load_message(str(exc), src)) from None
    return ReaderKernel(src, decl, lib, lib.signature(decl.name))
