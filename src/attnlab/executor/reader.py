"""A reader's own kernel on the CPU executor: a .cu file (or a source string, a notebook cell) built
(attnlab.executor.reader_source) and launched like the book's kernels, with NumPy arrays, CPU torch
tensors and Python numbers as its arguments, and the executor's findings (races, out-of-bounds,
uninitialized reads, deadlocks, barrier misuse), shared-memory bank counts and printf output as
the answer. Every argument is checked against the entry's parameters before any launch.

    result = run("my_add.cu", grid=4, block=256, args=(a, b, c, n))   # c is updated in place
    print(result)                                                      # findings, banks, "clean"
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field

import numpy as np

from . import library as _library
from .library import BankCounts, Finding

from .reader_source import POINTEE_DTYPES, POINTERS, SCALARS, Param, ReaderError, ReaderKernel, build

# The launch limits of a CUDA device (compute capability 9.0: the H100's 227 KB of shared memory a block).
MAX_BLOCK_THREADS = 1024
BLOCK_LIMITS = (1024, 1024, 64)
GRID_LIMITS = (2**31 - 1, 65535, 65535)
MAX_SHARED_BYTES = 232448

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


def check_shared_bytes(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_SHARED_BYTES:
        raise ReaderError(f"shared_bytes {value!r}: dynamic shared memory is 0..{MAX_SHARED_BYTES} bytes "
                          "(227 KB, the H100's most a block)")
    return int(value)


def is_torch(value) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "is_contiguous")


def _kind_of(value) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array"
    if is_torch(value):
        return f"a {str(value.dtype).replace('torch.', '')} tensor"
    return f"{value!r} ({type(value).__name__})"


@dataclass
class _Bound:
    """The arguments of one launch, checked: ctypes-ready values, and the arrays behind pointers."""
    values: list
    arrays: list = field(default_factory=list)      # (param index, caller's object, numpy view, copy back)


def _as_array(value, label: str, param: Param, copy_back: bool):
    """The NumPy view of an array argument (sharing its memory), checked."""
    if is_torch(value):
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
    allowed = POINTEE_DTYPES.get(param.pointee)
    if allowed and arr.dtype.name not in allowed:
        want = allowed[0]
        how = f".to(torch.{want})" if is_torch(value) else f".astype(np.{want})"
        raise ReaderError(f"{label} is {_kind_of(value)}, but `{param.decl}` points to {param.pointee} ({want}): "
                          f"convert it ({how})")
    return arr


def _scalar(value, letter: str, label: str, param: Param):
    ctype_name, dtype = SCALARS[letter]
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    elif is_torch(value) and value.dim() == 0:
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, np.ndarray) or is_torch(value):
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
    if isinstance(args, (np.ndarray, str, bytes)) or is_torch(args) or not hasattr(args, "__len__"):
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


def launch(kernel: ReaderKernel, grid, block, args, shared_bytes: int = 0, *, seed: int = 0, races: bool = True,
           banks: bool = True, time_limit: float = 60.0) -> RunResult:
    grid, block, shared_bytes = dims("grid", grid), dims("block", block), check_shared_bytes(shared_bytes)
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
        report = lib.launch(kernel.name, grid, block, shared_bytes, values, seed=seed, races=races, banks=banks,
                            time_limit=float(time_limit), buffers=buffers)
        for i, value, arr, copy_back, ptr in placed:
            if copy_back and arr.nbytes:
                ctypes.memmove(arr.ctypes.data, ptr, arr.nbytes)
    finally:
        lib.free_all()
    return RunResult(kernel=kernel.name, file=kernel.source.filename, grid=grid, block=block,
                     shared_bytes=shared_bytes, seed=seed, arrays=[v for _, v, _, _ in bound.arrays],
                     names=[params[i].name for i, _, _, _ in bound.arrays], findings=list(report.findings),
                     banks=dict(report.banks) if banks else {}, completed=report.completed, stdout=report.stdout,
                     library=str(lib.path))


def run(source_or_path, entry: str | None = None, grid=(1,), block=(32,), args=(), shared_bytes: int = 0, *,
        seed: int = 0, races: bool = True, banks: bool = True, time_limit: float = 60.0,
        name: str | None = None) -> RunResult:
    """Build (once) and run a reader's kernel on the CPU executor; see attnlab.cpu.run."""
    dims("grid", grid)  # the launch configuration is checked before any build
    dims("block", block)
    check_shared_bytes(shared_bytes)
    kernel = build(source_or_path, entry, name=name)
    return launch(kernel, grid, block, args, shared_bytes, seed=seed, races=races, banks=banks,
                  time_limit=time_limit)
