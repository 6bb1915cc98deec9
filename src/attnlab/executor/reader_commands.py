"""`python -m attnlab run-cpu`'s --arg specs and the `%%cuda_cpu` magic's line, turned into a run of
attnlab.executor.reader, so that cli.py and attnlab.cpu stay thin.
"""
from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import numpy as np


from .reader import ReaderError, RunResult, check_shared_bytes, dims, is_torch, run

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
        a = arr if isinstance(arr, np.ndarray) else arr.detach().numpy() if is_torch(arr) else np.asarray(arr)
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
                shared_bytes=check_shared_bytes(_magic_int("shared", ns.shared, namespace)),
                seed=_magic_int("seed", ns.seed, namespace), name=ns.name, time_limit=float(limit))


def run_cell(line: str, cell: str, namespace: dict) -> RunResult:
    """The %%cuda_cpu magic: run the cell's CUDA source with the line's configuration, print the
    summary and the first elements of each array, keep the result as `_cuda_cpu` in `namespace`."""
    options = parse_magic_line(line, namespace)
    # The cell's first line is the magic's: JupyterLab numbers the source from the line after it
    # as 2, and so do the findings.
    result = run("\n" + cell, **options)
    namespace["_cuda_cpu"] = result
    print(result.summary())
    if result.arrays:
        print(format_arrays(result))
    return result
