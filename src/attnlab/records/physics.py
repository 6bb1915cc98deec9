"""What a real GPU cannot have measured: a record that breaks these is refused, naming the case.

- No time below the least time of its shape on its GPU: the FLOPs over the datasheet's peak, and
  the bytes that cannot sit in L2 over the DRAM bandwidth (the timer keeps inputs warm in L2, so
  only what exceeds L2 must come from DRAM), both with MARGIN for hardware a little faster than its
  datasheet (clocks above the rated boost).
- No TFLOP/s (a time, or the measured matmul ceiling) above the peak, and no copy above the DRAM
  bandwidth, with the same margin.
- Every timing carries its raw per-replay samples: the median and spread a record states must be
  the ones its samples give (attnlab.records.timing.summarize), sample by sample above the least time.
A GPU the datasheet table (attnlab.gpus) does not know is held to the fastest one it does.
"""
from __future__ import annotations

import math

from ..gpus import GPUS, GpuSpec, lookup
from ..shapes import Shape
from .timing import summarize

MARGIN = 1.25  # hardware up to 25% faster than its datasheet still passes


def yardstick(gpu: dict) -> tuple[GpuSpec, str]:
    """The datasheet a record's GPU is held to, and in whose name."""
    known = lookup(gpu.get("name", ""))
    if known is not None:
        return known, f"the {known.key}'s"
    fastest = max(GPUS, key=lambda g: (g.fp16_tflops, g.dram_gbps))
    return fastest, f"the fastest GPU attnlab knows ({fastest.key}, since {gpu.get('name')!r} is not in its table)"


def least_us(shape: Shape, causal: bool, gpu: dict) -> float:
    """The least device time of one attention call at `shape` on the record's GPU, margin included."""
    spec, _ = yardstick(gpu)
    compute = shape.flops(causal) / (spec.fp16_tflops * 1e12 * MARGIN) * 1e6
    l2 = float(gpu.get("l2_mib") or 0.0) * 2**20
    beyond = max(0.0, shape.io_bytes() - l2) if l2 else 0.0
    memory = beyond / (spec.dram_gbps * 1e9 * MARGIN) * 1e6
    return max(compute, memory)


def timing_problems(t, where: str, least: float | None) -> list[str]:
    """Why a timing dict cannot be a real measurement: samples missing or not adding up to its
    median and spread, or a sample below `least` µs."""
    if not isinstance(t, dict):
        return [f"{where}: not a timing"]
    samples = t.get("samples_us")
    if not isinstance(samples, list) or not samples or not all(
            isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in samples):
        return [f"{where}: no raw samples (samples_us) to recompute its median from"]
    if t.get("reps") != len(samples):
        return [f"{where}: {len(samples)} samples, but reps says {t.get('reps')}"]
    again = summarize(samples, len(samples), t.get("inner", 1))
    problems = []
    for key in ("median_us", "p10_us", "p90_us"):
        stated = t.get(key)
        if not isinstance(stated, (int, float)) or not math.isclose(stated, getattr(again, key), rel_tol=1e-9):
            problems.append(f"{where}: {key} {stated!r} is not what its samples give ({getattr(again, key):.4f})")
    if least is not None and min(samples) < least:
        problems.append(f"{where}: a sample of {min(samples):.4f} µs is below the least time this GPU can take "
                        f"({least:.3f} µs)")
    return problems


def _bench_problems(rec: dict) -> list[str]:
    gpu = rec["gpu"]
    spec, whose = yardstick(gpu)
    problems = []
    for i, case in enumerate(rec["cases"]):
        shape, causal = Shape(*case["shape"]), case["causal"]
        least = least_us(shape, causal, gpu)
        tag = f"cases[{i}] ({shape.label()}, causal={causal})"
        for name, t in case["sdpa"].items():
            problems += timing_problems({k: v for k, v in t.items() if k != "host"}, f"{tag} SDPA {name} device", least)
            if "host" in t:
                problems += timing_problems(t["host"], f"{tag} SDPA {name} host", least)
        timed = [("kernel", k, e) for k, e in case["kernels"].items()] + \
                [("baseline", k, e) for k, e in case.get("baselines", {}).items()]
        for what, name, entry in timed:
            for clock in ("device", "host"):
                if clock in entry:
                    problems += timing_problems(entry[clock], f"{tag} {what} {name} {clock}", least)
    ceilings = rec.get("ceilings", {})
    matmul, copy = ceilings.get("matmul"), ceilings.get("copy")
    if matmul:
        t = (matmul.get("timing") or {}).get("median_us")
        if isinstance(t, (int, float)) and t > 0 and not math.isclose(
                matmul.get("tflops", 0), 2.0 * matmul.get("n", 0) ** 3 / (t * 1e-6) / 1e12, rel_tol=1e-6):
            problems.append(f"ceilings.matmul: {matmul.get('tflops')} TFLOP/s is not what its n and timing give")
        if matmul.get("tflops", 0) > spec.fp16_tflops * MARGIN:
            problems.append(f"ceilings.matmul: {matmul['tflops']:.1f} TFLOP/s is over {whose} peak "
                            f"{spec.fp16_tflops:.0f} (with {MARGIN}x margin)")
        problems += timing_problems(matmul.get("timing"), "ceilings.matmul", None)
    if copy:
        t = (copy.get("timing") or {}).get("median_us")
        if isinstance(t, (int, float)) and t > 0 and not math.isclose(
                copy.get("gbps", 0), 2.0 * copy.get("mib", 0) * 2**20 / (t * 1e-6) / 1e9, rel_tol=1e-6):
            problems.append(f"ceilings.copy: {copy.get('gbps')} GB/s is not what its size and timing give")
        if copy.get("gbps", 0) > spec.dram_gbps * MARGIN:
            problems.append(f"ceilings.copy: {copy['gbps']:.0f} GB/s is over {whose} DRAM bandwidth "
                            f"{spec.dram_gbps:.0f} (with {MARGIN}x margin)")
        problems += timing_problems(copy.get("timing"), "ceilings.copy", None)
    return problems


def _search_problems(rec: dict) -> list[str]:
    problems = []
    for i, case in enumerate(rec["cases"]):
        if case.get("status") != "ok":
            continue
        least = least_us(Shape(*case["shape"]), case["causal"], rec["gpu"])
        where = f"cases[{i}] ({case['kernel']} {case['config']})"
        device = case.get("device")
        problems += timing_problems(device, f"{where} device", least)
        if isinstance(device, dict) and case.get("time_us") != device.get("median_us"):
            problems.append(f"{where}: time_us {case.get('time_us')} is not its timing's median")
    return problems


def _profile_problems(rec: dict) -> list[str]:
    problems = []
    for i, case in enumerate(rec["cases"]):
        for name, m in case["metrics"].items():
            value = m.get("value") if isinstance(m, dict) else None
            if name.endswith(("pct_of_peak_sustained_active", "pct_of_peak_sustained_elapsed")) and \
                    isinstance(value, (int, float)) and not 0 <= value <= 100.5:
                problems.append(f"cases[{i}] ({case['kernel']}): {name} = {value}, not a share of a peak")
    return problems


def record_problems(rec: dict) -> list[str]:
    """Every way a (well-formed) record breaks physics or its own samples; empty when none."""
    return {"bench": _bench_problems, "search": _search_problems, "profile": _profile_problems}.get(
        rec["kind"], lambda r: [])(rec)
