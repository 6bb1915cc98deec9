"""Records of GPU runs under results/: written with full provenance, loaded, merged, verified.

A record is one JSON file, results/<gpu>/<utc>-<kind>.json, holding the GPU, the software,
the commit, the sha256 of every kernel it measured and of the harness, and what was measured.
A kernel's numbers are *fresh* only while its source hash still matches: the freshest record of
each (GPU, kernel) must match the source, or `verify` fails and the kernel must be measured again.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .gpus import lookup, tflops
from .paths import results_dir
from .registry import KERNELS
from .shapes import Shape
from .sources import harness_hash, kernel_hash

SCHEMA = 1
KINDS = ("bench", "check", "sanitize", "search", "profile")
# What each case of a record must hold, by kind (bench cases are checked on their own below).
CASE_FIELDS = {
    "check": ("kernel", "shape", "causal", "seed", "passed", "max_err"),
    "sanitize": ("kernel", "tool", "clean", "errors"),
    # one configuration tried by chapter 8's search (attnlab.search): status "ok" (checked, then
    # timed), "static" (refused before any GPU time), "failed" (wrong output) or "error"
    "search": ("kernel", "shape", "causal", "config", "status", "time_us"),
    # Nsight Compute metrics of one kernel launch (attnlab.profile)
    "profile": ("kernel", "shape", "causal", "function", "metrics"),
}
SEARCH_STATUSES = ("ok", "static", "failed", "error")
REQUIRED = {"schema": int, "kind": str, "created_utc": str, "gpu": dict, "software": dict, "git": dict,
            "harness_sha256": str, "kernels": dict}
REQUIRED_GPU = ("name", "compute_capability", "sm_count", "driver", "cuda_runtime")


def new_record(kind: str, specs, settings: dict | None = None) -> dict:
    from .env import device_info, git_commit, software_versions

    return {
        "schema": SCHEMA,
        "kind": kind,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": device_info(),
        "software": software_versions(),
        "git": git_commit(),
        "harness_sha256": harness_hash(),
        "kernels": {s.id: {"sha256": kernel_hash(s), "source": s.source} for s in specs},
        "settings": settings or {},
        "cases": [],
    }


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def write_record(record: dict, root: Path | None = None) -> Path:
    problems = validate_record(record)
    if problems:
        raise ValueError("refusing to write a malformed record: " + "; ".join(problems))
    root = root or results_dir()
    stamp = record["created_utc"].replace(":", "").replace("-", "")
    # One kernel's record names it: a GPU session checks and sanitizes kernels in parallel
    # processes, which finish within the same second.
    kernel = f"-{next(iter(record['kernels']))}" if len(record["kernels"]) == 1 else ""
    folder = root / gpu_slug(record["gpu"]["name"])
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    for n in range(1, 1000):  # never over another record: "x" creates or fails
        path = folder / f"{stamp}-{record['kind']}{kernel}{'' if n == 1 else f'-{n}'}.json"
        try:
            with open(path, "x") as f:
                f.write(text)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}: a thousand records named {stamp}-{record['kind']}{kernel}")


def validate_record(rec) -> list[str]:
    """What is wrong with a record's shape; empty when it is well formed."""
    if not isinstance(rec, dict):
        return ["record is not a JSON object"]
    problems = [f"missing or mistyped '{k}' (want {t.__name__})" for k, t in REQUIRED.items()
                if not isinstance(rec.get(k), t)]
    if problems:
        return problems
    if rec["schema"] != SCHEMA:
        problems.append(f"schema {rec['schema']} is not {SCHEMA}")
    if rec["kind"] not in KINDS:
        return problems + [f"kind {rec['kind']!r} is not one of {KINDS}"]
    try:
        datetime.strptime(rec["created_utc"], "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        problems.append(f"created_utc {rec['created_utc']!r} is not UTC ISO-8601 (YYYY-MM-DDTHH:MM:SSZ)")
    problems += [f"gpu.{k} missing" for k in REQUIRED_GPU if k not in rec["gpu"]]
    for kid, meta in rec["kernels"].items():
        if not isinstance(meta, dict) or not re.fullmatch(r"[0-9a-f]{64}", str(meta.get("sha256", ""))):
            problems.append(f"kernel {kid}: no sha256")
    if not isinstance(rec.get("cases"), list):
        problems.append("cases is not a list")
    elif rec["kind"] == "bench":
        for i, case in enumerate(rec["cases"]):
            for key in ("shape", "causal", "sdpa", "kernels"):
                if key not in case:
                    problems.append(f"cases[{i}] lacks {key}")
            for kid in case.get("kernels", {}):
                if kid not in rec["kernels"]:
                    problems.append(f"cases[{i}] measures {kid}, which has no hash in the record")
    else:
        need = CASE_FIELDS[rec["kind"]]
        for i, case in enumerate(rec["cases"]):
            for key in need:
                if key not in case:
                    problems.append(f"cases[{i}] lacks {key}")
        if rec["kind"] in ("search", "profile"):
            problems += _search_profile_problems(rec)
    return problems


def _search_profile_problems(rec: dict) -> list[str]:
    problems = []
    for i, case in enumerate(rec["cases"]):
        if case.get("kernel") not in rec["kernels"]:
            problems.append(f"cases[{i}] measures {case.get('kernel')}, which has no hash in the record")
        if rec["kind"] == "profile":
            if not isinstance(case.get("metrics"), dict):
                problems.append(f"cases[{i}].metrics is not an object")
            continue
        status, t = case.get("status"), case.get("time_us")
        if status not in SEARCH_STATUSES:
            problems.append(f"cases[{i}] status {status!r} is not one of {SEARCH_STATUSES}")
        elif status == "ok" and not (isinstance(t, (int, float)) and t > 0):
            problems.append(f"cases[{i}] is ok but has no time")
        elif status != "ok" and t is not None:
            problems.append(f"cases[{i}] has a time but status {status!r}: only checked configurations are timed")
        if not isinstance(case.get("config"), dict):
            problems.append(f"cases[{i}].config is not an object")
    if rec["kind"] == "search":
        summary = rec.get("search")
        if not isinstance(summary, dict) or not {"kernel", "shape", "causal", "strategy", "best"} <= set(summary):
            problems.append("search lacks its summary (kernel, shape, causal, strategy, best)")
    return problems


@dataclass
class Loaded:
    path: Path
    record: dict


def load_records(root: Path | None = None) -> tuple[list[Loaded], list[str]]:
    """Every record under results/, oldest first, and the problems of those that are malformed."""
    root = root or results_dir()
    loaded, problems = [], []
    for path in sorted(root.rglob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            problems.append(f"{path}: unreadable ({exc})")
            continue
        issues = validate_record(rec)
        if issues:
            problems.append(f"{path}: " + "; ".join(issues))
            continue
        loaded.append(Loaded(path, rec))
    loaded.sort(key=lambda item: (item.record["created_utc"], str(item.path)))
    return loaded, problems


def current_hashes() -> dict[str, str]:
    return {kid: kernel_hash(spec) for kid, spec in KERNELS.items()}


def freshest(loaded: list[Loaded], kind: str | None = None) -> dict[tuple[str, str], Loaded]:
    """The newest record of each (GPU name, kernel id), optionally of one kind."""
    latest: dict[tuple[str, str], Loaded] = {}
    for item in loaded:
        if kind and item.record["kind"] != kind:
            continue
        for kid in item.record["kernels"]:
            latest[(item.record["gpu"]["name"], kid)] = item
    return latest


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)     # malformed, or stale: fail
    fresh: list[tuple[str, str, str]] = field(default_factory=list)  # (gpu, kernel, record)
    missing: list[str] = field(default_factory=list)      # registered kernels with no fresh record
    superseded: int = 0                                   # old records of changed kernels, newer ones exist

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(root: Path | None = None) -> Verification:
    loaded, problems = load_records(root)
    out = Verification(problems=list(problems))
    hashes = current_hashes()
    for (gpu, kid), item in sorted(freshest(loaded).items()):
        recorded = item.record["kernels"][kid]["sha256"]
        if kid not in hashes:
            out.problems.append(f"{item.path}: kernel {kid} is not in the registry")
        elif recorded != hashes[kid]:
            out.problems.append(f"{item.path}: {kid} on {gpu} was measured from source {recorded[:12]}, "
                                f"but kernels/ now hashes to {hashes[kid][:12]}: measure it again")
        else:
            out.fresh.append((gpu, kid, str(item.path)))
    fresh_ids = {kid for _, kid, _ in out.fresh}
    out.missing = [kid for kid in hashes if kid not in fresh_ids]
    newest = {(str(item.path), kid) for (_, kid), item in freshest(loaded).items()}
    out.superseded = sum(1 for item in loaded for kid, meta in item.record["kernels"].items()
                         if (str(item.path), kid) not in newest and meta["sha256"] != hashes.get(kid))
    return out


def fresh_kernels(rec: dict, hashes: dict[str, str] | None = None) -> set[str]:
    """The kernels of a record whose source still hashes to what was measured."""
    hashes = current_hashes() if hashes is None else hashes
    return {kid for kid, meta in rec["kernels"].items() if hashes.get(kid) == meta["sha256"]}


def fresh_records(kind: str, root: Path | None = None) -> list[dict]:
    """Records of `kind` whose every kernel still matches its source, oldest first."""
    loaded, _ = load_records(root)
    hashes = current_hashes()
    return [item.record for item in loaded if item.record["kind"] == kind
            and fresh_kernels(item.record, hashes) == set(item.record["kernels"])]


def fresh_bench_records(root: Path | None = None) -> list[dict]:
    """Bench records whose every kernel still matches its source, oldest first."""
    return fresh_records("bench", root)


def report_rows(root: Path | None = None) -> list[dict]:
    """For each GPU, kernel, shape and causal flag in the freshest fresh records: the kernel's
    median device time, the fastest SDPA backend of the same run, their ratio, and the check."""
    rows: dict[tuple, dict] = {}
    for rec in fresh_bench_records(root):  # oldest first: newer runs overwrite
        gpu = rec["gpu"]["name"]
        for case in rec["cases"]:
            if not case["sdpa"]:
                continue
            best_name = min(case["sdpa"], key=lambda n: case["sdpa"][n]["median_us"])
            best = case["sdpa"][best_name]["median_us"]
            for kid, entry in case["kernels"].items():
                if "device" not in entry:
                    continue
                t = entry["device"]["median_us"]
                shape = Shape(*case["shape"])
                achieved = tflops(shape, case["causal"], t)
                spec = lookup(gpu)
                matmul = rec.get("ceilings", {}).get("matmul", {}).get("tflops")
                rows[(gpu, kid, tuple(case["shape"]), case["causal"])] = {
                    "gpu": gpu, "kernel": kid, "shape": case["shape"], "causal": case["causal"],
                    "median_us": t, "sdpa_backend": best_name, "sdpa_median_us": best,
                    "speedup_vs_sdpa": best / t, "check_passed": bool(entry["check"]["passed"]),
                    "tflops": achieved,
                    "share_of_peak": achieved / spec.fp16_tflops if spec else None,
                    "share_of_matmul": achieved / matmul if matmul else None,
                    "recorded_utc": rec["created_utc"],
                }
    return [rows[k] for k in sorted(rows)]
