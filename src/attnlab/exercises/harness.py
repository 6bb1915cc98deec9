"""What every exercise checker needs: the reader's file built for the CPU executor, launches with
numpy or torch buffers, and each kind of trouble said in one line.

A checker raises `Fail(message)` at the first thing wrong; attnlab.exercises.registry.check turns it into
the verdict. Messages name the case ("L=65 D=64 causal"), what is wrong, and where in the reader's
file (the executor's findings carry `file.cu:line`).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class Fail(Exception):
    """The reader's kernel is wrong: the one-line reason."""


# ---- building -------------------------------------------------------------------------------

def build(path: Path, entries, defines=()):
    """The executor library of the reader's file (laid out as any reader's kernel is, by
    attnlab.executor.reader_source: a copy under its own name, so that findings name it; kernels/'s
    headers stay includable). Fail with the compiler's first error when it does not build."""
    from ..executor.build import ExecutorBuildError
    from ..executor.library import load
    from ..executor.reader_source import Source, source_dir

    path = Path(path)
    name = path.name if path.suffix == ".cu" else path.stem + ".cu"
    folder = source_dir(Source(path.read_text(), name, str(path)))
    try:
        return load(name, list(entries), defines, src_dir=folder)
    except ExecutorBuildError as exc:
        if f"compiling {name}" not in str(exc) and f"linking {name}" not in str(exc):
            raise  # the executor's own runtime did not build: not the reader's doing
        raise Fail(f"does not compile: {first_error(str(exc), name)}") from None


def first_error(log: str, name: str) -> str:
    """The compiler's first error, as `file.cu:LINE: message` (or the log's last line)."""
    lines = log.splitlines()
    for line in lines:
        if "error:" in line:
            head, _, msg = line.partition("error:")
            place = head.strip().rstrip(":")
            parts = place.split(":")
            where = f"{Path(parts[0]).name}:{parts[1]}" if len(parts) >= 2 and parts[1].isdigit() else Path(place).name
            return f"{where}: {msg.strip()}"
    if any("undefined reference" in line for line in lines):
        missing = next(line for line in lines if "undefined reference" in line)
        return missing.split("undefined reference", 1)[1].strip() + " is declared but never defined"
    return lines[-1].strip() if lines else "the compiler failed without a message"


# ---- launching ------------------------------------------------------------------------------

@dataclass
class Buffer:
    """An executor buffer: `array` is copied in before the launch and, if `out`, back after."""
    array: np.ndarray
    name: str = "?"
    out: bool = False
    fill: int | None = None  # bytes to fill with instead of the array's contents (0xFF: NaN halves)


def launch(lib, entry: str, grid, block, smem: int, args, seed: int = 0, banks: bool = False,
           count: bool = False, time_limit: float = 60.0):
    """One launch; args are ints, floats and Buffers (copied in, and back for `out` ones). With
    `banks`, the bank conflicts are counted, per instruction too (report.counts); `count` counts
    the instructions without the bank log."""
    ptrs, outs = [], []
    try:
        for a in args:
            if isinstance(a, Buffer):
                arr = np.ascontiguousarray(a.array)
                p = lib.alloc(max(arr.nbytes, 1), a.name, arr.itemsize, arr.shape)  # named in findings
                if a.fill is not None:
                    ctypes.memset(p, a.fill, arr.nbytes)
                else:
                    ctypes.memmove(p, arr.ctypes.data, arr.nbytes)
                ptrs.append(p)
                if a.out:
                    outs.append((p, a.array))
            else:
                ptrs.append(a)
        report = lib.launch(entry, grid, block, smem, ptrs, seed=seed, banks=banks, count=banks or count,
                            time_limit=time_limit)
        for p, arr in outs:
            ctypes.memmove(arr.ctypes.data, p, arr.nbytes)
    finally:
        lib.free_all()
    return report


# ---- saying what went wrong -----------------------------------------------------------------

# When several kinds of finding come out of one launch, the one most likely to be the cause first:
# a barrier used wrongly (a count that disagrees, a second arrival, a barrier only some threads of
# a warp reach) before the deadlock it usually causes, which names only where every thread waits.
_ORDER = ("barrier count mismatch", "barrier arrived twice", "divergent barrier", "deadlock", "timeout",
          "divergent warp collective", "warp collective mask", "shuffle width", "cp.async read before wait",
          "race", "global conflict between blocks", "global out of bounds", "shared out of bounds",
          "write through a pointer to const", "misaligned access", "uninitialized shared read")


def finding_line(f) -> str:
    """One finding, short: kind: message (at file.cu:LINE; other side at ...)."""
    where = f"at {f.where}" if f.where and f.where != "?" else ""
    if getattr(f, "other_where", "") and f.other_where != f.where:
        where += f"; the other side at {f.other_where}"
    return f"{f.kind}: {f.message}" + (f" ({where})" if where else "")


def findings_fail(report, case: str) -> None:
    """Fail on the launch's findings (or an unfinished launch): the likeliest cause first, with
    how many others there were."""
    findings = list(report.findings)
    if not findings:
        if not report.completed:
            raise Fail(f"{case}: the launch did not complete (the executor stopped it without a finding)")
        return
    rank = {k: i for i, k in enumerate(_ORDER)}
    findings.sort(key=lambda f: rank.get(f.kind, len(_ORDER)))
    more = len(findings) - 1
    tail = f" [+{more} more finding{'s' * (more != 1)}]" if more else ""
    raise Fail(f"{case}: {finding_line(findings[0])}{tail}")


_SITE_KINDS = {"ld/st": ("shared load", "shared store"), "ldmatrix": ("ldmatrix",), "cp.async": ("cp.async",)}


def banks_fail(report, case: str, kinds) -> None:
    """Fail when one of `kinds` ("ldmatrix", "cp.async", "ld/st") took more wavefronts than ideal,
    naming the instruction with the most excess wavefronts when the launch was counted."""
    for kind in kinds:
        b = report.banks.get(kind)
        if b is None or b.wavefronts <= b.ideal:
            continue
        sites = [st for c in report.counts for st in c.sites
                 if st.kind in _SITE_KINDS[kind] and st.units > st.ideal and st.requests]
        if sites:
            st = max(sites, key=lambda x: x.units - x.ideal)
            raise Fail(f"{case}: bank conflicts: the {st.kind} at {st.where} takes {st.units / st.requests:.1f} "
                       f"wavefronts per warp request where {st.ideal / st.requests:.1f} would do "
                       f"({st.units / st.ideal:.2g}-way on average; {st.units} for {st.ideal} in this launch)")
        raise Fail(f"{case}: bank conflicts: {kind} took {b.wavefronts} wavefronts where {b.ideal} would do "
                   f"({b.wavefronts / b.ideal:.1f} per request phase, ideal 1.0)")


def case_text(shape, causal: bool | None = None, seed: int | None = None) -> str:
    B, H, L, D = shape
    text = f"B={B} H={H} L={L} D={D}" if (B, H) != (1, 1) else f"L={L} D={D}"
    if causal is not None:
        text += " causal" if causal else " non-causal"
    if seed:
        text += f" seed {seed}"
    return text


# ---- attention-shaped checks ----------------------------------------------------------------

def attention_inputs(shape, seed: int):
    """q, k, v as every check draws them (attnlab.pass_rule.make_inputs), on the CPU."""
    from ..pass_rule import INPUT_OFFSET, make_inputs

    return make_inputs(shape, seed, device="cpu", offset=INPUT_OFFSET)


def judge_attention(out, q, k, v, causal: bool, case: str) -> None:
    """The pass rule against the fp64 reference (attnlab.pass_rule.judge), said as the first wrong
    place: NaN (unwritten) elements, or the row with the largest error."""
    import torch

    from ..pass_rule import ATOL_FLOOR, judge
    from ..reference import naive_fp16, reference_attention

    ref = reference_attention(q, k, v, causal)
    fp16_err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
    verdict = judge(out, ref, fp16_err, ATOL_FLOOR)
    if verdict.passed:
        return
    B, H, L, _ = out.shape
    bad = ~torch.isfinite(out)
    if bad.any():
        b, h, r, d = (int(x) for x in bad.nonzero()[0])
        rows = int(bad.any(dim=-1).sum())
        head = f"head {b * H + h}, " if B * H > 1 else ""
        raise Fail(f"{case}: {head}row {r} column {d} is {'NaN' if torch.isnan(out[b, h, r, d]) else 'Inf'} "
                   f"({rows} of {B * H * L} rows have NaN/Inf: never written, or computed from -inf - -inf, 0/0)")
    err = (out.double() - ref).abs()
    b, h, r, d = (int(x) for x in (err == err.max()).nonzero()[0])
    head = f"head {b * H + h}, " if B * H > 1 else ""
    raise Fail(f"{case}: wrong at {head}row {r}, column {d}: {float(out[b, h, r, d]):.4g} where the reference has "
               f"{float(ref[b, h, r, d]):.4g} (max error {verdict.max_err:.3g} > tolerance {verdict.tolerance:.3g})")


def run_attention(lib, entry: str, shape, causal: bool, seed: int, grid, block, smem: int, banks: bool = False,
                  count: bool = False, inputs=None):
    """The fused (q, k, v, o, L, D, scale, causal) launch at `shape`; o starts as NaN. `inputs`: q,
    k, v (fp16 CPU tensors of `shape`) instead of the drawn ones. Returns (out, report, q, k, v)."""
    import math

    import torch

    q, k, v = inputs if inputs is not None else attention_inputs(shape, seed)
    out = np.empty(tuple(shape), np.float16)
    args = [Buffer(q.numpy(), "Q"), Buffer(k.numpy(), "K"), Buffer(v.numpy(), "V"),
            Buffer(out, "O", out=True, fill=0xFF), shape[2], shape[3], 1.0 / math.sqrt(shape[3]), int(causal)]
    report = launch(lib, entry, grid, block, smem, args, seed=seed, banks=banks, count=count)
    return torch.from_numpy(out), report, q, k, v


def attention_cases(lib, entry: str, cases, config, banks_kinds=()) -> int:
    """Each (shape, causal, seed): findings first, then bank conflicts of `banks_kinds`, then the pass
    rule. `config(shape)` -> (grid, block, smem). Returns the number of cases run."""
    for shape, causal, seed in cases:
        case = case_text(shape, causal, seed)
        grid, block, smem = config(shape)
        out, report, q, k, v = run_attention(lib, entry, shape, causal, seed, grid, block, smem,
                                             banks=bool(banks_kinds))
        findings_fail(report, case)
        banks_fail(report, case, banks_kinds)
        judge_attention(out, q, k, v, causal, case)
    return len(cases)
