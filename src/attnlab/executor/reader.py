"""A reader's own kernel on the CPU executor: a .cu file (or a source string, a notebook cell) built
and launched like the book's kernels, with NumPy arrays, CPU torch tensors and Python numbers as
its arguments, and the executor's findings (races, out-of-bounds, uninitialized reads, deadlocks,
barrier misuse) and shared-memory bank counts as the answer.

    result = run("my_add.cu", grid=4, block=256, args=(a, b, c, n))   # c is updated in place
    print(result)                                                      # findings, banks, "clean"

The source is copied into a folder named by its content under the cache
(cache_dir()/cpu/reader/<hash>/, keeping the file's own name, so findings say `my_add.cu:12`) and
built once by build_library; a second run of the same source loads the cached library. Every
argument is checked against the entry's parameters before any launch. Plain `__global__`
functions only: template kernels and overloaded names are out of scope (a non-template wrapper
that calls a `__device__` template is the way in).

Also here, so that cli.py and attnlab.cpu stay thin: `run-cpu`'s --arg specs and the
`%%cuda_cpu` magic's line.
"""
from __future__ import annotations

import argparse
import ast
import ctypes
import dataclasses
import hashlib
import inspect
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..paths import cache_dir
from . import library as _library
from .build import ExecutorBuildError
from .library import BankCounts, Finding, LaunchReport, Library, load

# The launch limits of a CUDA device (compute capability 9.0: the H100's 227 KB of shared memory a block).
MAX_BLOCK_THREADS = 1024
BLOCK_LIMITS = (1024, 1024, 64)
GRID_LIMITS = (2**31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 232448

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
_POINTEE_DTYPES: dict[str, tuple[str, ...]] = {}
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
        _POINTEE_DTYPES[_n] = _dtypes

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
                 "`__shared__ T name[N]...;` and `extern __shared__ T name[];`, one per line")
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


def build(source_or_path, entry: str | None = None, *, name: str | None = None) -> ReaderKernel:
    """Build (or load from the cache) the kernel `entry` of a reader's source."""
    src = read_source(source_or_path, name)
    decl = choose_entry(find_kernels(src.text), entry, src.shown)
    folder = source_dir(src)
    try:
        lib = load(src.filename, [decl.name], src_dir=folder)
    except ExecutorBuildError as exc:
        raise ReaderBuildError(_compiler_message(str(exc), folder, src)) from None
    except OSError as exc:  # the library links, but a symbol it uses is defined nowhere
        raise ReaderBuildError(_load_message(str(exc), src)) from None
    return ReaderKernel(src, decl, lib, lib.signature(decl.name))


# ---- launch configuration and arguments ---------------------------------------------------------

def dims(what: str, value) -> tuple[int, int, int]:
    """A grid or block as three ints: an int, or a tuple/list of 1 to 3 ints (the rest are 1)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        t = (int(value),)
    elif isinstance(value, (tuple, list)) and 1 <= len(value) <= 3 and \
            all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        t = tuple(int(v) for v in value)
    else:
        raise ReaderError(f"{what} {value!r}: an int or a tuple of 1 to 3 ints")
    t = t + (1,) * (3 - len(t))
    limits = GRID_LIMITS if what == "grid" else BLOCK_LIMITS
    for axis, (v, top) in enumerate(zip(t, limits)):
        if not 1 <= v <= top:
            raise ReaderError(f"{what} {_dim_text(t)}: its {'xyz'[axis]} must be 1..{top}, not {v}")
    if what == "block" and t[0] * t[1] * t[2] > MAX_BLOCK_THREADS:
        raise ReaderError(f"block {_dim_text(t)}: {t[0] * t[1] * t[2]} threads; a block has 1..{MAX_BLOCK_THREADS}")
    return t


def _dim_text(t) -> str:
    return "(" + ", ".join(map(str, t)) + ")"


def _shared(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_SHARED_BYTES:
        raise ReaderError(f"shared_bytes {value!r}: dynamic shared memory is 0..{MAX_SHARED_BYTES} bytes "
                          "(227 KB, the H100's most a block)")
    return int(value)


def _is_torch(value) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "is_contiguous")


def _kind_of(value) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array"
    if _is_torch(value):
        return f"a {str(value.dtype).replace('torch.', '')} tensor"
    return f"{value!r} ({type(value).__name__})"


@dataclass
class _Bound:
    """The arguments of one launch, checked: ctypes-ready values, and the arrays behind pointers."""
    values: list
    arrays: list = field(default_factory=list)      # (param index, caller's object, numpy view, copy back)


def _as_array(value, label: str, param: Param, copy_back: bool):
    """The NumPy view of an array argument (sharing its memory), checked."""
    if _is_torch(value):
        if value.device.type != "cpu":
            raise ReaderError(f"{label} is a tensor on {value.device}; the CPU executor takes CPU tensors (.cpu())")
        if not value.is_contiguous():
            raise ReaderError(f"{label} is a non-contiguous tensor: pass .contiguous() (and read the result from it)")
        t = value.detach()
        import torch

        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        try:
            arr = t.numpy()
        except (TypeError, RuntimeError) as exc:
            raise ReaderError(f"{label}: a {t.dtype} tensor has no NumPy view ({exc})") from None
    elif isinstance(value, np.ndarray):
        arr = value
        if not arr.flags.c_contiguous:
            raise ReaderError(f"{label} is not C-contiguous: pass np.ascontiguousarray(...) (and read the result from it)")
        if copy_back and not arr.flags.writeable:
            raise ReaderError(f"{label} is read-only but `{param.decl}` may write through it: pass a writable "
                              "array, or declare the parameter pointer-to-const")
    else:
        raise ReaderError(f"{label} is {_kind_of(value)}, but `{param.decl}` is a pointer: pass a NumPy array "
                          "or a CPU torch tensor")
    if arr.dtype.hasobject or arr.dtype.kind in "cmMUSV":
        raise ReaderError(f"{label} is a {arr.dtype} array; the executor takes arrays of numbers")
    allowed = _POINTEE_DTYPES.get(param.pointee)
    if allowed and arr.dtype.name not in allowed:
        want = allowed[0]
        raise ReaderError(f"{label} is {_kind_of(value)}, but `{param.decl}` points to {param.pointee} ({want}): "
                          f"convert it (.astype(np.{want}))")
    return arr


def _scalar(value, letter: str, label: str, param: Param):
    ctype_name, dtype = SCALARS[letter]
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    elif _is_torch(value) and value.dim() == 0:
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray) or _is_torch(value):
        raise ReaderError(f"{label} is {_kind_of(value)}, but `{param.decl}` is a scalar ({ctype_name})")
    dt = np.dtype(dtype)
    if dt.kind == "b":
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return bool(value)
        raise ReaderError(f"{label} is {_kind_of(value)}, but `{param.decl}` is a bool: pass True or False")
    if dt.kind in "iu":
        if isinstance(value, float):
            raise ReaderError(f"{label} is {value!r}, a float, but `{param.decl}` is an integer ({ctype_name}): "
                              f"pass an int")
        if not isinstance(value, int):
            raise ReaderError(f"{label} is {_kind_of(value)}, but `{param.decl}` is an integer ({ctype_name})")
        info = np.iinfo(dt)
        if not info.min <= value <= info.max:
            raise ReaderError(f"{label} is {value}, outside {ctype_name}'s range {info.min}..{info.max}")
        return int(value)
    if not isinstance(value, (int, float)) or isinstance(value, complex):
        raise ReaderError(f"{label} is {_kind_of(value)}, but `{param.decl}` is a {ctype_name}")
    value = float(value)
    top = float(np.finfo(dt).max)
    if math.isfinite(value) and abs(value) > top:
        raise ReaderError(f"{label} is {value!r}, past {ctype_name}'s largest value {top:g}")
    return value  # a __half too: Library.launch turns the number into its 16 bits


def bind(kernel: ReaderKernel, args) -> _Bound:
    """`args` checked against the entry's signature letters and declared parameters, before any
    launch: their count, pointer or scalar, an array's element type against the pointee type, a
    scalar's range. A ReaderError names the first wrong one ("argument 3 (n) ...")."""
    if isinstance(args, (np.ndarray, str, bytes)) or _is_torch(args) or not hasattr(args, "__len__"):
        args = (args,)
    args = list(args)
    sig, params = kernel.signature, kernel.params()
    if len(args) != len(sig):
        raise ReaderError(f"{kernel.name} takes {len(sig)} argument{'s' if len(sig) != 1 else ''} "
                          f"({', '.join(p.decl for p in params) or 'none'}); got {len(args)}")
    supported = set(_library._CTYPE_OF) | {"P"} if "p" in _library._CTYPE_OF else set(_library._CTYPE_OF)
    bound = _Bound(values=[])
    for i, (letter, param, value) in enumerate(zip(sig, params, args)):
        label = f"argument {i + 1} ({param.name})"
        if letter not in supported or (letter not in POINTERS and letter not in SCALARS):
            passes = ", ".join(["pointers"] + [SCALARS[c][0] for c in SCALARS if c in supported])
            raise ReaderError(f"{label}: `{param.decl}` is a parameter type the CPU executor cannot pass yet "
                              f"(it passes {passes})")
        if letter in POINTERS:
            copy_back = letter == "p" and not param.const_pointee
            arr = _as_array(value, label, param, copy_back)
            bound.arrays.append((i, value, arr, copy_back))
            bound.values.append(None)  # the buffer's address, once allocated
        else:
            bound.values.append(_scalar(value, letter, label, param))
    # The same array twice shares one buffer; arrays that overlap otherwise cannot be given one each.
    for a in range(len(bound.arrays)):
        for b in range(a):
            x, y = bound.arrays[a][2], bound.arrays[b][2]
            same = x.ctypes.data == y.ctypes.data and x.nbytes == y.nbytes
            if not same and x.nbytes and y.nbytes and np.may_share_memory(x, y):
                pa, pb = params[bound.arrays[a][0]], params[bound.arrays[b][0]]
                raise ReaderError(f"argument {bound.arrays[a][0] + 1} ({pa.name}) overlaps argument "
                                  f"{bound.arrays[b][0] + 1} ({pb.name}) without being the same array: the "
                                  "executor gives each array its own buffer; pass separate arrays")
    return bound


# ---- the run -------------------------------------------------------------------------------------

@dataclass
class RunResult:
    """What a reader's kernel did on the CPU executor. `arrays`: the array arguments in argument
    order (the caller's own objects, updated in place unless pointer-to-const); `findings`: what a
    sanitizer would report; `banks`: shared-memory requests and wavefronts by kind."""
    kernel: str
    file: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    seed: int
    arrays: list
    names: list[str]
    findings: list[Finding]
    banks: dict[str, BankCounts]
    completed: bool
    stdout: str = ""
    library: str = ""

    @property
    def clean(self) -> bool:
        return self.completed and not self.findings

    def __getitem__(self, name: str):
        """An array argument by its parameter's name: result["c"]."""
        try:
            return self.arrays[self.names.index(name)]
        except ValueError:
            raise KeyError(f"{name!r}: the array arguments are {', '.join(self.names) or 'none'}") from None

    def summary(self, stdout_lines: int = 40) -> str:
        launch = f"{self.kernel}<<<{_dim_text(self.grid)}, {_dim_text(self.block)}"
        launch += f", {self.shared_bytes}>>>" if self.shared_bytes else ">>>"
        if self.clean:
            state = "clean"
        elif not self.completed:
            state = f"did not complete; {len(self.findings)} finding{'s' if len(self.findings) != 1 else ''}"
        else:
            state = f"{len(self.findings)} finding{'s' if len(self.findings) != 1 else ''}"
        lines = [f"{self.file}: {launch} on the CPU executor (schedule seed {self.seed}): {state}"]
        lines += [f"  {f.line()}" for f in self.findings]
        used = {k: b for k, b in self.banks.items() if b.requests}
        if not self.banks:
            pass
        elif not used:
            lines.append("shared-memory banks: no shared-memory requests")
        else:
            lines.append("shared-memory banks:")
            w = max(len(k) for k in used)
            for k, b in used.items():
                lines.append(f"  {k:<{w}}  {b.requests} requests, {b.wavefronts} wavefronts (ideal {b.ideal}), "
                             f"conflict ratio {b.conflict_ratio:.2f}")
        if self.stdout:
            out = self.stdout.rstrip("\n").split("\n")
            lines.append(f"printf output ({len(out)} line{'s' if len(out) != 1 else ''}):")
            lines += [f"  {ln}" for ln in out[:stdout_lines]]
            if len(out) > stdout_lines:
                lines.append(f"  ... {len(out) - stdout_lines} more lines (RunResult.stdout holds them all)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, p, cycle):  # IPython's display
        p.text(self.summary())


def _report_has_stdout() -> bool:
    return "stdout" in {f.name for f in dataclasses.fields(LaunchReport)}


def _launch_takes_buffers() -> bool:
    return "buffers" in inspect.signature(Library.launch).parameters


class _CaptureStdout:
    """The kernel's printf output, where the launch report does not carry it: file descriptor 1
    pointed at a temporary file around the launch (C's stdio flushed before it comes back)."""

    def __enter__(self):
        sys.stdout.flush()
        self._libc = ctypes.CDLL(None)
        self._libc.fflush(None)
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(1)
        os.dup2(self._file.fileno(), 1)
        self.text = ""
        return self

    def __exit__(self, *exc):
        self._libc.fflush(None)
        os.dup2(self._saved, 1)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace")
        self._file.close()
        return False


def launch(kernel: ReaderKernel, grid, block, args, shared_bytes: int = 0, *, seed: int = 0, races: bool = True,
           banks: bool = True, time_limit: float = 60.0) -> RunResult:
    grid, block, shared_bytes = dims("grid", grid), dims("block", block), _shared(shared_bytes)
    bound = bind(kernel, args)
    params = kernel.params()
    lib = kernel.library
    values = list(bound.values)
    buffers, placed = [], []
    try:
        for i, value, arr, copy_back in bound.arrays:
            twin = next((p for j, v, a, _, p in placed if a.ctypes.data == arr.ctypes.data and a.nbytes == arr.nbytes),
                        None)
            if twin is None:
                twin = lib.alloc(arr.nbytes)
                if arr.nbytes:
                    ctypes.memmove(twin, arr.ctypes.data, arr.nbytes)
                buffers.append((params[i].name, arr.dtype.itemsize, tuple(arr.shape)))
            placed.append((i, value, arr, copy_back, twin))
            values[i] = twin
        options = dict(seed=seed, races=races, banks=banks, time_limit=float(time_limit))
        if _launch_takes_buffers():
            options["buffers"] = buffers
        if _report_has_stdout():
            report = lib.launch(kernel.name, grid, block, shared_bytes, values, **options)
            printed = getattr(report, "stdout", "") or ""
        else:
            with _CaptureStdout() as cap:
                report = lib.launch(kernel.name, grid, block, shared_bytes, values, **options)
            printed = cap.text
        for i, value, arr, copy_back, ptr in placed:
            if copy_back and arr.nbytes:
                ctypes.memmove(arr.ctypes.data, ptr, arr.nbytes)
    finally:
        lib.free_all()
    return RunResult(kernel=kernel.name, file=kernel.source.filename, grid=grid, block=block,
                     shared_bytes=shared_bytes, seed=seed, arrays=[v for _, v, _, _ in bound.arrays],
                     names=[params[i].name for i, _, _, _ in bound.arrays], findings=list(report.findings),
                     banks=dict(report.banks) if banks else {}, completed=report.completed, stdout=printed,
                     library=str(lib.path))


def run(source_or_path, entry: str | None = None, grid=(1,), block=(32,), args=(), shared_bytes: int = 0, *,
        seed: int = 0, races: bool = True, banks: bool = True, time_limit: float = 60.0,
        name: str | None = None) -> RunResult:
    """Build (once) and run a reader's kernel on the CPU executor; see attnlab.cpu.run."""
    dims("grid", grid)  # the launch configuration is checked before any build
    dims("block", block)
    _shared(shared_bytes)
    kernel = build(source_or_path, entry, name=name)
    return launch(kernel, grid, block, args, shared_bytes, seed=seed, races=races, banks=banks,
                  time_limit=time_limit)


# ---- run-cpu's command line ------------------------------------------------------------------------

_DTYPES = {"float": "float32", "half": "float16", "double": "float64", "int": "int32", "unsigned": "uint32",
           "uint": "uint32", "long": "int64"}
ARRAY_KINDS = ("zeros", "ones", "arange", "rand", "randn", "full")


def parse_dims(what: str, text: str) -> tuple[int, ...]:
    """"4", "4,2", "4x2x1", "(4, 2)" -> a tuple of ints (checked by dims())."""
    cleaned = text.strip().strip("()[]").replace("x", ",").replace(" ", "")
    parts = [p for p in cleaned.split(",")]
    if not cleaned or not 1 <= len(parts) <= 3 or not all(re.fullmatch(r"\d+", p) for p in parts):
        raise ReaderError(f"--{what} {text}: X[,Y[,Z]] with positive integers, e.g. --{what} 256 or --{what} 16,16")
    t = tuple(int(p) for p in parts)
    dims(what, t)
    return t


def parse_arg(spec: str, rng: np.random.Generator):
    """One --arg: an int ("256", "-1", "0x10"), a float ("0.5", "1e-3"), or an array
    KIND:DTYPE:SHAPE[:VALUE]: zeros, ones, arange, rand (uniform in [0, 1); ints in [0, 100)),
    randn (normal), full (VALUE); SHAPE as 1024 or 64x64."""
    s = spec.strip()
    if re.fullmatch(r"[+-]?(0x[0-9a-fA-F]+|\d+)", s):
        return int(s, 0) if not re.fullmatch(r"[+-]?0\d+", s) else int(s)
    if ":" not in s:
        try:
            return float(s)
        except ValueError:
            raise ReaderError(f"--arg {spec}: an int, a float, or KIND:DTYPE:SHAPE with KIND one of "
                              f"{', '.join(ARRAY_KINDS)} (e.g. zeros:float32:1024, rand:float16:64x64)") from None
    parts = s.split(":")
    kind = parts[0]
    if kind not in ARRAY_KINDS or len(parts) not in (3, 4) or (len(parts) == 4) != (kind == "full"):
        raise ReaderError(f"--arg {spec}: KIND:DTYPE:SHAPE with KIND one of {', '.join(ARRAY_KINDS)} "
                          "(full:DTYPE:SHAPE:VALUE), e.g. zeros:float32:1024, arange:int32:256, rand:float16:64x64")
    try:
        dtype = np.dtype(_DTYPES.get(parts[1], parts[1]))
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise ReaderError(f"--arg {spec}: {parts[1]!r} is not a NumPy number type (float32, float16, int32, ...)")
    if not re.fullmatch(r"\d+(x\d+)*", parts[2]):
        raise ReaderError(f"--arg {spec}: shape {parts[2]!r} is not like 1024 or 64x64")
    shape = tuple(int(n) for n in parts[2].split("x"))
    if int(np.prod(shape)) * dtype.itemsize > 1 << 30:
        raise ReaderError(f"--arg {spec}: more than 1 GiB")
    if kind == "zeros":
        return np.zeros(shape, dtype)
    if kind == "ones":
        return np.ones(shape, dtype)
    if kind == "arange":
        return np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)
    if kind == "full":
        try:
            value = float(parts[3]) if dtype.kind == "f" else int(parts[3], 0)
        except ValueError:
            raise ReaderError(f"--arg {spec}: {parts[3]!r} is no {dtype} value") from None
        return np.full(shape, value, dtype)
    if kind == "randn":
        if dtype.kind != "f":
            raise ReaderError(f"--arg {spec}: randn makes floats")
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 100, shape).astype(dtype)


def format_arrays(result: RunResult, count: int = 8) -> str:
    lines = []
    for name, arr in zip(result.names, result.arrays):
        a = arr if isinstance(arr, np.ndarray) else arr.detach().numpy() if _is_torch(arr) else np.asarray(arr)
        flat = a.reshape(-1)
        shape = "x".join(map(str, a.shape))
        head = ", ".join(f"{v:.6g}" if a.dtype.kind == "f" else str(v) for v in flat[:count].tolist())
        more = f", ... ({flat.size} elements)" if flat.size > count else ""
        lines.append(f"{name} ({a.dtype}[{shape}]): [{head}{more}]")
    return "\n".join(lines)


def run_command(args) -> int:
    """`python -m attnlab run-cpu`: `args` holds file, entry, grid, block, shared, arg (a list of
    specs) and seed as the command line gave them. Prints the summary and the first elements of
    each array argument; 0 when clean, 1 with findings (a ReaderError for what cannot run)."""
    grid = parse_dims("grid", args.grid)
    block = parse_dims("block", args.block)
    if not Path(args.file).is_file():
        raise ReaderError(f"{args.file}: no such file")
    rng = np.random.default_rng(args.seed)
    values = [parse_arg(s, rng) for s in args.arg or []]
    result = run(args.file, args.entry, grid, block, values, args.shared, seed=args.seed)
    print(result.summary())
    if result.arrays:
        print(format_arrays(result))
    return 0 if result.clean else 1


# ---- the %%cuda_cpu magic's line -------------------------------------------------------------------

class _LineParser(argparse.ArgumentParser):
    def error(self, message):
        raise ReaderError(f"%%cuda_cpu: {message} (usage: %%cuda_cpu [ENTRY] --grid X[,Y[,Z]] --block X[,Y[,Z]] "
                          "--args NAME_OR_LITERAL ... [--shared N] [--seed N] [--name FILE.cu])")


def _magic_parser() -> argparse.ArgumentParser:
    p = _LineParser(prog="%%cuda_cpu", add_help=False)
    p.add_argument("entry", nargs="?", default=None)
    p.add_argument("--grid", default="1")
    p.add_argument("--block", default="32")
    p.add_argument("--args", nargs="*", default=[])
    p.add_argument("--shared", default="0")
    p.add_argument("--seed", default="0")
    p.add_argument("--name", default="cell.cu")
    p.add_argument("--time-limit", default="60")
    return p


def _lookup(token: str, namespace: dict, what: str):
    """A name in the namespace (dotted attributes too), else a Python literal."""
    if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", token) and token not in ("True", "False", "None"):
        head, *rest = token.split(".")
        if head not in namespace:
            raise ReaderError(f"%%cuda_cpu {what}: {token!r} is not defined in your namespace")
        value = namespace[head]
        for attr in rest:
            try:
                value = getattr(value, attr)
            except AttributeError:
                raise ReaderError(f"%%cuda_cpu {what}: {token!r}: no attribute {attr!r}") from None
        return value
    try:
        return ast.literal_eval(token)
    except (ValueError, SyntaxError):
        raise ReaderError(f"%%cuda_cpu {what}: {token!r} is neither a name in your namespace nor a literal "
                          "(write {expression} for IPython to expand it)") from None


def _magic_dims(what: str, token: str, namespace: dict):
    if re.fullmatch(r"[\d,x() ]+", token):
        return parse_dims(what, token)
    return dims(what, _lookup(token, namespace, f"--{what}"))


def _magic_int(what: str, token: str, namespace: dict) -> int:
    value = _lookup(token, namespace, f"--{what}")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ReaderError(f"%%cuda_cpu --{what} {token}: an integer")
    return int(value)


def parse_magic_line(line: str, namespace: dict) -> dict:
    """The %%cuda_cpu line as run()'s keyword arguments (entry, grid, block, args, shared_bytes,
    seed, name, time_limit): --args tokens are names in `namespace` or Python literals."""
    import shlex

    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise ReaderError(f"%%cuda_cpu: {exc}") from None
    ns = _magic_parser().parse_args(tokens)
    limit = _lookup(ns.time_limit, namespace, "--time-limit")
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
        raise ReaderError(f"%%cuda_cpu --time-limit {ns.time_limit}: a positive number of seconds")
    return dict(entry=ns.entry, grid=_magic_dims("grid", ns.grid, namespace),
                block=_magic_dims("block", ns.block, namespace),
                args=tuple(_lookup(t, namespace, "--args") for t in ns.args),
                shared_bytes=_shared(_magic_int("shared", ns.shared, namespace)),
                seed=_magic_int("seed", ns.seed, namespace), name=ns.name, time_limit=float(limit))


def run_cell(line: str, cell: str, namespace: dict) -> RunResult:
    """The %%cuda_cpu magic: run the cell's CUDA source with the line's configuration, print the
    summary and the first elements of each array, keep the result as `_cuda_cpu` in `namespace`."""
    options = parse_magic_line(line, namespace)
    result = run(cell, **options)
    namespace["_cuda_cpu"] = result
    print(result.summary())
    if result.arrays:
        print(format_arrays(result))
    return result
