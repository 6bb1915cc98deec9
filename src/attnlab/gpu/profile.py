"""Appendix A: Nsight Compute counters of each kernel at the mission shape, as records.

Nsight Compute (`ncu`) wraps a child process that launches one kernel at one shape, causal off
then on (`python -m attnlab profile --child KERNEL`), profiles only the kernel's own entry points
(`--kernel-name regex:...`), and prints the requested metrics as CSV. The CSV is parsed into a
record of kind "profile": per kernel, shape and causal flag, the profiled function and its
metrics with their units. `ncu` replays each kernel once per pass its metrics need (caches flushed
and clocks locked to base by default), so the numbers describe one launch of the kernel alone,
not a timing to compare with attnlab.gpu.bench.

    ncu --csv --metrics <list> --kernel-name regex:'^(attn_fwd_07_mma_d64|...)$' --target-processes all \\
        python -m attnlab profile --child 07_mma

The parser reads both CSV layouts `ncu --csv` prints: the default "details" page (one row per
metric: ... "Kernel Name", ..., "Metric Name", "Metric Unit", "Metric Value") and `--page raw`
(one row per kernel, a column per metric, a second row of units).
"""
from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ..kernels import registry
from ..shapes import MISSION, Shape


@dataclass(frozen=True)
class Metric:
    name: str
    short: str
    meaning: str


# What the appendix asks of every kernel; each line says what the number means.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("gpu__time_duration.sum", "duration",
           "the kernel's duration under the profiler (clocks locked to base, caches flushed): not a bench time"),
    Metric("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe %",
           "share of the cycles an SM was active in which its tensor-core (HMMA) pipe was busy"),
    Metric("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %",
           "DRAM throughput as a share of its peak over the kernel's duration"),
    Metric("lts__t_bytes.sum", "L2 bytes",
           "bytes the L2 cache served (every global load and store passes through it)"),
    Metric("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "smem ld conflicts",
           "extra shared-memory wavefronts caused by bank conflicts on shared loads"),
    Metric("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum", "smem st conflicts",
           "extra shared-memory wavefronts caused by bank conflicts on shared stores"),
    Metric("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy %",
           "resident warps as a share of the SM's maximum, averaged over the cycles an SM was active "
           "(an idle SM adds no cycles, so this cannot see idle SMs)"),
    Metric("sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "SMs active %",
           "cycles in which an SM had a warp resident, as a share of the kernel's elapsed cycles, "
           "averaged over every SM: idle SMs lower it"),
    Metric("launch__registers_per_thread", "registers",
           "registers per thread of the launch (what ptxas allocated; attnlab inspect reads the same)"),
)}
DEFAULT_METRICS = tuple(METRICS)


class ProfileError(RuntimeError):
    """ncu could not profile (missing, no permission to read counters, or no kernel captured)."""


def ncu_path() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "ncu")):
            return os.path.join(root, "bin", "ncu")
    return None


def entry_names(kernel_id: str, shape: Shape = MISSION) -> list[str]:
    """The extern "C" functions a kernel may launch at this shape (the ones ncu should profile):
    one per key split for chapter 7, since the split follows the GPU the child runs on, and the
    kernels its runner launches after it (FlashAttention-2's combine)."""
    spec = registry.get(kernel_id)
    return spec.entries_at_head_dim(shape.D) + list(spec.helper_entries)


def ncu_command(kernel_id: str, metrics=DEFAULT_METRICS, shape: Shape = MISSION, ncu: str = "ncu",
                python: str | None = None) -> list[str]:
    """The command line that profiles one kernel at one shape (causal off, then on)."""
    names = "|".join(re.escape(n) for n in entry_names(kernel_id, shape))
    return [ncu, "--csv", "--metrics", ",".join(metrics), "--kernel-name", f"regex:^({names})$",
            "--target-processes", "all", python or sys.executable, "-m", "attnlab", "profile",
            "--child", kernel_id, "--shape", *(str(x) for x in shape)]


def run_child(kernel_id: str, shape: Shape = MISSION) -> int:
    """Inside ncu: launch the kernel once without and once with the causal mask."""
    from .launch import exercise

    exercise(kernel_id, [Shape(*shape)])
    return 0


def _number(text: str) -> float | None:
    """A metric value as ncu prints it ("12.5", "1,234,567", "n/a") -> float or None."""
    text = text.strip().strip('"')
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def _csv_lines(text: str) -> list[str]:
    """The CSV part of ncu's output: from the header row on, without ==PROF== lines or the child's prints."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"') and '"Kernel Name"' in line), None)
    if start is None:
        return []
    return [line for line in lines[start:] if line.startswith('"')]


def parse_ncu_csv(text: str) -> list[dict]:
    """Profiled kernels in launch order: {"id", "function", "grid", "block", "metrics": {name:
    {"value": float or None, "unit": str}}}. Accepts the details and the raw page layouts."""
    lines = _csv_lines(text)
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(header)}
    kernels: dict[str, dict] = {}

    def kernel(row) -> dict:
        kid = row[col["ID"]] if "ID" in col else str(len(kernels))
        return kernels.setdefault(kid, {
            "id": int(kid) if kid.isdigit() else len(kernels), "function": row[col["Kernel Name"]],
            "grid": row[col["Grid Size"]] if "Grid Size" in col else None,
            "block": row[col["Block Size"]] if "Block Size" in col else None, "metrics": {}})

    if "Metric Name" in col:  # details page: one row per metric
        for row in body:
            if len(row) < len(header):
                continue
            kernel(row)["metrics"][row[col["Metric Name"]]] = {"value": _number(row[col["Metric Value"]]),
                                                               "unit": row[col["Metric Unit"]]}
    else:  # raw page: a row of units under the header, then one row per kernel
        metric_cols = [name for name in header if "__" in name]
        units = body[0] if body and not (body[0][col["ID"]] if "ID" in col else body[0][0]).strip().isdigit() else None
        for row in body[1:] if units else body:
            if len(row) < len(header):
                continue
            k = kernel(row)
            for name in metric_cols:
                k["metrics"][name] = {"value": _number(row[col[name]]), "unit": units[col[name]] if units else ""}
    return sorted(kernels.values(), key=lambda k: k["id"])


def profile_kernel(kernel_id: str, metrics=DEFAULT_METRICS, shape: Shape = MISSION, timeout: int = 900) -> list[dict]:
    """Run ncu over the child for one kernel; the record cases (causal off, then on)."""
    ncu = ncu_path()
    if ncu is None:
        raise ProfileError("ncu (Nsight Compute) is not on PATH; it ships with the CUDA toolkit")
    cmd = ncu_command(kernel_id, metrics, shape, ncu=ncu)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "LC_ALL": "C"})
    text = proc.stdout + "\n" + proc.stderr
    if "ERR_NVGPUCTRPERM" in text:
        raise ProfileError("ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM): run as root "
                           "or with the driver option NVreg_RestrictProfilingToAdminUsers=0")
    kernels = parse_ncu_csv(proc.stdout)
    spec = registry.get(kernel_id)
    flags = (False, True) if spec.causal else (False,)
    if proc.returncode != 0 or len(kernels) < len(flags):
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise ProfileError(f"ncu captured {len(kernels)} launches of {kernel_id} (expected {len(flags)}), "
                           f"exit {proc.returncode}:\n{tail}")
    return [{"kernel": kernel_id, "shape": list(shape), "causal": causal, "function": k["function"],
             "grid": k["grid"], "block": k["block"], "metrics": k["metrics"]}
            for causal, k in zip(flags, kernels)]


def ncu_version() -> str | None:
    exe = ncu_path()
    if exe is None:
        return None
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1] if out else None


def run_profile(kernel_ids: list[str] | None = None, metrics=DEFAULT_METRICS, shape: Shape = MISSION,
                progress: bool = True) -> tuple[dict, list[str]]:
    """Profile kernels on this GPU; returns the record (kind "profile", not yet written) and the
    failures (kernel: reason) of those ncu could not capture."""
    from tqdm import tqdm

    from ..env import require_gpu
    from ..records.results import new_record

    require_gpu("profiling")
    specs = registry.select(kernel_ids)
    cases, failures = [], []
    for spec in tqdm(specs, desc="ncu", unit="kernel", disable=not progress):
        if not spec.supports_head_dim(shape.D):
            continue
        try:
            cases += profile_kernel(spec.id, metrics, shape)
        except (ProfileError, subprocess.TimeoutExpired) as exc:
            failures.append(f"{spec.id}: {exc}")
    measured = [s for s in specs if any(c["kernel"] == s.id for c in cases)]
    record = new_record("profile", measured, settings={"metrics": list(metrics), "shape": list(shape),
                                                        "ncu": ncu_version()})
    record["cases"] = cases
    return record, failures


def _fresh_cases(kind: str, root=None):
    """(record, case) of every case of a fresh `kind` record (attnlab.records.results.fresh_records: only
    its fresh kernels), oldest commit first (so newer ones overwrite when rows are keyed)."""
    from ..records.results import fresh_records

    for rec in fresh_records(kind, root):
        yield from ((rec, case) for case in rec["cases"])


def fresh_profile_rows(root=None) -> list[dict]:
    """One row per (GPU, kernel, causal) from the newest fresh profile record of each: the metric
    values by short name, with the GPU and date."""
    rows = {}
    for rec, case in _fresh_cases("profile", root):
        row = {"gpu": rec["gpu"]["name"], "date": rec["created_utc"][:10], "kernel": case["kernel"],
               "shape": tuple(case["shape"]), "causal": case["causal"], "function": case["function"]}
        for name, m in case["metrics"].items():
            row[METRICS[name].short if name in METRICS else name] = m["value"]
        rows[(row["gpu"], row["kernel"], row["shape"], row["causal"])] = row
    return [rows[k] for k in sorted(rows)]


def fresh_sanitize_rows(root=None) -> list[dict]:
    """One row per (GPU, kernel, tool) from the newest fresh sanitize record of each."""
    rows = {}
    for rec, case in _fresh_cases("sanitize", root):
        rows[(rec["gpu"]["name"], case["kernel"], case["tool"])] = {
            "gpu": rec["gpu"]["name"], "date": rec["created_utc"][:10], "kernel": case["kernel"],
            "tool": case["tool"], "clean": case["clean"], "errors": case["errors"]}
    return [rows[k] for k in sorted(rows)]
