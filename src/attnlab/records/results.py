"""Records of GPU runs under results/: written with full provenance, loaded, judged, verified.

A record is one JSON file, results/<gpu>/<utc>-<kind>.json, holding the GPU, the software, the
commit and tree it measured (attnlab.records.provenance), the fingerprint of everything that decides its
numbers (attnlab.records.fingerprint: per kernel its source, build and launch geometry; the harness
modules of its kind), the raw samples of every timing, and what was measured.

Loading judges each record (`assess`):
- *refused*: malformed; not bound to this repository (unknown commit, a tree that does not hash
  to what it claims, hashes that are not those of its commit's files, dated before its commit or
  in the future); breaking physics (attnlab.records.physics); a failed check carrying a time. `verify`
  fails on any refused record.
- *local*: measured from a tree with uncommitted changes: kept for reading, never shown.
- otherwise each kernel is *fresh* or *stale*: stale, with the reasons, when its build, launch
  geometry, launcher or a harness module of the record's kind differs now, or its source does and
  no longer compiles to the code the record ran (attnlab.records.code).
The freshest record of each (GPU, kind, kernel) follows commit order. Where it is stale, the kernel
(or its harness) changed since a GPU measured it: `verify` names it and why, and the kernel awaits a
GPU run, as one never measured does; a kernel may change between the rare sessions that have a GPU.
Only a refused record fails `verify` (and, with strict, a stale freshest record too: what a GPU
session checks after measuring everything again). The book, the report and the scoreboard read
fresh records only (`fresh_records`).
"""
from __future__ import annotations

import copy
import functools
import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..gpus import lookup, tflops
from ..kernels.registry import KERNELS
from ..paths import results_dir
from ..shapes import Shape

SCHEMA = 2
KINDS = ("bench", "check", "sanitize", "search", "profile")
# What each case of a record must hold, by kind (bench cases are checked on their own below).
CASE_FIELDS = {
    "check": ("kernel", "shape", "causal", "seed", "passed", "max_err"),
    "sanitize": ("kernel", "tool", "clean", "errors"),
    # one configuration tried by chapter 8's search (attnlab.gpu.search): status "ok" (checked, then
    # timed), "static" (refused before any GPU time), "failed" (wrong output) or "error"
    "search": ("kernel", "shape", "causal", "config", "status", "time_us"),
    # Nsight Compute metrics of one kernel launch (attnlab.gpu.profile)
    "profile": ("kernel", "shape", "causal", "function", "metrics"),
}
SEARCH_STATUSES = ("ok", "static", "failed", "error")
REQUIRED = {"schema": int, "kind": str, "created_utc": str, "gpu": dict, "software": dict, "git": dict,
            "harness": dict, "kernels": dict}
REQUIRED_GPU = ("name", "compute_capability", "sm_count", "driver", "cuda_runtime")
REQUIRED_KERNEL = ("sha256", "source", "build", "launch_sha256")


def new_record(kind: str, specs, settings: dict | None = None, gpu: dict | None = None,
               software: dict | None = None) -> dict:
    """A record of `kind` about to measure `specs` on the GPU at hand (or `gpu`, a device_info
    dict), with its provenance and fingerprints; write_record adds the launch geometry once the
    cases are in."""
    from ..env import device_info, software_versions
    from ..kernels.sources import kernel_hash
    from .fingerprint import arch_of, build_of, harness_digests, harness_modules, runner_module
    from .provenance import describe_now, working_files

    gpu = gpu or device_info()
    files = working_files()
    return {
        "schema": SCHEMA,
        "kind": kind,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": gpu,
        "software": software if software is not None else software_versions(),
        "git": describe_now(files=files),
        "harness": harness_digests(harness_modules(kind, specs), files.get),
        "kernels": {s.id: {"sha256": kernel_hash(s), "source": s.source, "build": build_of(s, arch_of(gpu)),
                           "runner": runner_module(s)} for s in specs},
        "settings": settings or {},
        "cases": [],
    }


def seal(record: dict) -> dict:
    """Add each kernel's launch geometry fingerprint, from the cases the record now holds."""
    from ..kernels.registry import get
    from .fingerprint import arch_of, launch_digest, launches_of

    arch = arch_of(record["gpu"])
    for kid, meta in record["kernels"].items():
        if kid in KERNELS:
            meta["launch_sha256"] = launch_digest(get(kid, arch), launches_of(record, kid), record["gpu"]["sm_count"])
    return record


def gpu_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def write_record(record: dict, root: Path | None = None) -> Path:
    """Seal and write a record; a malformed one is refused. Whether it is bound, physical and fresh
    is judged when it is read (assess)."""
    if isinstance(record, dict) and isinstance(record.get("kernels"), dict) and record.get("cases") is not None:
        seal(record)
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
    for key, kind in (("name", str), ("compute_capability", str), ("sm_count", int)):
        if key in rec["gpu"] and not isinstance(rec["gpu"][key], kind):
            problems.append(f"gpu.{key} is not a {kind.__name__}")
    if isinstance(rec.get("cases"), list):
        for i, case in enumerate(rec["cases"]):
            shape = case.get("shape") if isinstance(case, dict) else None
            if shape is not None and not (isinstance(shape, (list, tuple)) and len(shape) == 4 and all(
                    isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)):
                problems.append(f"cases[{i}].shape {shape!r} is not four positive integers")
            if isinstance(case, dict) and "causal" in case and not isinstance(case["causal"], bool):
                problems.append(f"cases[{i}].causal is not true or false")
    if problems:
        return problems
    problems += [f"git.{k} missing" for k in ("commit", "tree", "dirty") if k not in rec["git"]]
    for kid, meta in rec["kernels"].items():
        if not isinstance(meta, dict) or not re.fullmatch(r"[0-9a-f]{64}", str(meta.get("sha256", ""))):
            problems.append(f"kernel {kid}: no sha256")
            continue
        problems += [f"kernel {kid}: no {k}" for k in REQUIRED_KERNEL if k not in meta]
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
            for name, entry in [*case.get("kernels", {}).items(), *case.get("baselines", {}).items()]:
                problems += _untimed_failure(entry, f"cases[{i}] {name}")
    else:
        need = CASE_FIELDS[rec["kind"]]
        for i, case in enumerate(rec["cases"]):
            for key in need:
                if key not in case:
                    problems.append(f"cases[{i}] lacks {key}")
        if rec["kind"] in ("search", "profile"):
            problems += _search_profile_problems(rec)
    return problems


def _untimed_failure(entry, where: str) -> list[str]:
    """A bench entry's time must follow a passed check: a failed (or missing) check with a time is
    a wrong answer timed, which no record may hold."""
    if not isinstance(entry, dict) or "skipped" in entry:
        return []
    check = entry.get("check")
    if not isinstance(check, dict) or not isinstance(check.get("passed"), bool):
        return [f"{where} has no check (passed true or false)"]
    if not check["passed"] and ({"device", "host"} & set(entry)):
        return [f"{where} failed its check but carries a time: a wrong output is never timed"]
    if check["passed"] and "device" not in entry:
        return [f"{where} passed its check but has no device time"]
    return []


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
        elif status == "ok" and (case.get("check") or {}).get("passed") is not True:
            problems.append(f"cases[{i}] is timed without a passed check: a wrong output is never timed")
        elif status != "ok" and t is not None:
            problems.append(f"cases[{i}] has a time but status {status!r}: only checked configurations are timed")
        if not isinstance(case.get("config"), dict):
            problems.append(f"cases[{i}].config is not an object")
    if rec["kind"] == "search":
        summary = rec.get("search")
        if not isinstance(summary, dict) or not {"kernel", "shape", "causal", "strategy", "best"} <= set(summary):
            problems.append("search lacks its summary (kernel, shape, causal, strategy, best)")
        else:
            problems += _summary_problems(rec["cases"], summary)
    return problems


def _summary_problems(cases: list, summary: dict) -> list[str]:
    """A search's best and default must be what its cases say, never numbers of their own."""
    ok = [c for c in cases if c.get("status") == "ok"]
    best, default, problems = summary.get("best"), summary.get("default"), []
    fastest = min((c["time_us"] for c in ok), default=None)
    if best is None:
        if ok:
            problems.append("search.best is empty although configurations were timed")
    elif not isinstance(best, dict) or best.get("time_us") != fastest or not any(
            c["time_us"] == fastest and c.get("config") == best.get("config") for c in ok):
        problems.append(f"search.best {best} is not the fastest timed case ({fastest} µs)")
    if isinstance(default, dict) and default.get("time_us") is not None and not any(
            c.get("config") == default.get("config") and c["time_us"] == default["time_us"] for c in ok):
        problems.append(f"search.default's time {default.get('time_us')} is not its case's")
    return problems



# --- judging what was read ------------------------------------------------------------------

@dataclass
class Assessed:
    """One record as read, and what this checkout makes of it."""
    path: Path
    record: dict
    refused: list[str] = field(default_factory=list)       # why it may never be shown
    local: bool = False                                    # measured from uncommitted changes
    stale: dict[str, list[str]] = field(default_factory=dict)  # kernel -> why it is stale ([] fresh)
    order: tuple = ()                                      # (commit order, created_utc, path)
    commit: str | None = None                              # the commit it is bound to (shown ones)

    @property
    def shown(self) -> bool:
        return not self.refused and not self.local

    @property
    def fresh(self) -> set[str]:
        return {kid for kid, why in self.stale.items() if not why} if self.shown else set()


class _Now:
    """What decides a number, as the working tree has it now (computed once per judging)."""

    def __init__(self):
        from .provenance import working_files

        self.files = working_files()
        self.sources = current_hashes()

    @functools.lru_cache(maxsize=None)
    def build(self, kid: str, arch: str) -> dict:
        from ..kernels.registry import get
        from .fingerprint import build_of

        return build_of(get(kid, arch), arch)


def current_hashes() -> dict[str, str]:
    from ..kernels.sources import kernel_hash

    return {kid: kernel_hash(spec) for kid, spec in KERNELS.items()}


def _against_commit(rec: dict, commit) -> list[str]:
    """The record's file hashes must be those of its commit's files."""
    from .fingerprint import harness_digests, module_path, source_digests

    problems = []
    for kid, meta in rec["kernels"].items():
        if kid in KERNELS and meta["sha256"] not in source_digests(KERNELS[kid], commit.read):
            problems.append(f"{kid}'s source hash {meta['sha256'][:12]} is not that of kernels/{KERNELS[kid].source} "
                            f"at its commit {commit.sha[:12]}")
    at_commit = harness_digests(rec["harness"], commit.read)
    problems += [f"harness {module_path(m)} hash {str(h)[:12]} is not that of the file at its commit {commit.sha[:12]}"
                 for m, h in rec["harness"].items() if at_commit.get(m) != h]
    return problems


def _entries_run(spec, launches, sms: int) -> set[str]:
    """The entries of `spec` its launches at (configuration, shape) pairs run on `sms` SMs, and its
    helpers (a combine kernel)."""
    return {spec.launch_config(shape, sms=sms)["entry"] for _, shape in launches
            if spec.supports_head_dim(shape.D)} | set(spec.helper_entries)


def _staleness(rec: dict, kid: str, now: _Now, commit=None) -> list[str]:
    """Why one kernel of a bound record no longer describes what running it now would measure.
    Where its source changed and nothing else did, the record stays fresh if the source still
    compiles, in the build the record ran (its architecture's defines, nvcc), to the code it ran,
    function for function (attnlab.records.code): that takes its `commit`'s files."""
    from .code import changed_code
    from .fingerprint import (arch_of, harness_digests, harness_modules, launch_digest, launches_of, module_path,
                              release, runner_module)
    from ..kernels.registry import get

    if kid not in KERNELS:
        return [f"{kid} is not in the registry"]
    meta, spec, arch = rec["kernels"][kid], KERNELS[kid], arch_of(rec["gpu"])
    why, launches = [], launches_of(rec, kid)
    built, then = now.build(kid, arch), meta["build"] if isinstance(meta["build"], dict) else {}
    for key in ("backend", "compiler", "flags", "arch", "defines"):
        same = (release(then.get(key, "")) == release(built[key]) if key == "compiler"
                else then.get(key) == built[key])
        if not same:
            why.append(f"its build's {key} changed ({then.get(key)} then, {built[key]} now)")
    if meta["launch_sha256"] != launch_digest(get(kid, arch), launches, rec["gpu"]["sm_count"]):
        why.append("its launch geometry changed (grid, block, shared memory, entry or key split)")
    modules = harness_modules(rec["kind"], [spec])
    if runner_module(spec) != meta.get("runner"):
        why.append(f"its launcher changed ({meta.get('runner')} then, {runner_module(spec)} now)")
    current = harness_digests(modules, now.files.get)
    for m in modules:
        if rec["harness"].get(m) != current[m]:
            why.append(f"harness module {module_path(m)} changed" if m in rec["harness"]
                       else f"harness module {module_path(m)} is new")
    if meta["sha256"] != now.sources[kid]:
        source = (f"its source changed: kernels/{spec.source} and its headers hash to {now.sources[kid][:12]} "
                  f"now, {meta['sha256'][:12]} then")
        # Compiling two versions is worth it only where nothing else already stales the kernel (so
        # its defines are the record's, checked above), built by nvcc as the record's was, and not
        # for a search record, whose configurations were built otherwise.
        if why or commit is None or any(config for config, _ in launches) or then.get("backend") != "nvcc":
            why.insert(0, source)
        elif (code := changed_code(built_spec := get(kid, arch), arch, commit.read, now.files.get,
                                   _entries_run(built_spec, launches, rec["gpu"]["sm_count"]))) is not None:
            why.insert(0, f"{source}, and {code}")
    return why


def assess(path: Path, rec, now: _Now | None = None) -> Assessed:
    """Judge one record (see the module's docstring). Never raises on a record's content: a field
    of the wrong type deep inside is a refusal, named."""
    out = Assessed(path, rec if isinstance(rec, dict) else {})
    try:
        out.refused = validate_record(rec)
        if not out.refused:
            _judge(out, rec, now)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ArithmeticError) as exc:
        out.refused = [f"malformed: {type(exc).__name__}: {exc}"]
        out.stale = {}
    return out


def _judge(out: Assessed, rec: dict, now: _Now | None) -> None:
    from .physics import record_problems
    from .provenance import binding_problems, find_commit

    out.refused += record_problems(rec)
    commit, problems = binding_problems(rec["git"], rec["created_utc"])
    if rec["git"].get("dirty") is not False and (commit is None or problems):
        # Uncommitted changes, and no commit of this history holds the code it ran.
        out.local = True
        commit, _ = find_commit(rec["git"].get("commit"))
    else:
        # Bound by its digest: a dirty flag set where the copy's .git stood at an older commit (a
        # GPU lease's) does not stand against a tree this history holds.
        out.refused += problems
        if commit is not None and not problems:
            out.refused += _against_commit(rec, commit)
            out.commit = commit.sha
    out.order = (commit.order if commit else -1, rec["created_utc"], str(out.path))
    if not out.refused:
        now = now or _Now()
        out.stale = {kid: _staleness(rec, kid, now, commit if out.commit else None) for kid in rec["kernels"]}


def load_records(root: Path | None = None) -> tuple[list[Assessed], list[str]]:
    """Every record under results/, judged, in commit order (oldest first), and the problems of
    those that cannot be read or are refused.

    Judging binds every record to its commit and compares code, seconds per call, and a page asks
    for records many times over. So the judgment is kept for this process, and made again when
    anything it reads has changed since: a record file (added, removed, rewritten), HEAD, the
    working tree's kernels/ and src/, or the environment that stamps or places them. The lists are
    new; the records in them are shared, and never changed by their readers."""
    from .provenance import held_still

    root = root or results_dir()
    paths = sorted(root.rglob("*.json"))
    with held_still():
        now = _Now()
        key = (str(root.resolve()), tuple(_file_state(p) for p in paths), _repository_state(now))
        if key not in _JUDGED:
            _JUDGED.clear()  # one judgment is all a process reads at a time
            _JUDGED[key] = _judge_all(paths, now)
    loaded, problems = _JUDGED[key]
    return list(loaded), list(problems)


# (results folder, its files' states, the repository's state) -> what load_records judged there
_JUDGED: dict[tuple, tuple[list[Assessed], list[str]]] = {}


def forget_judgments() -> None:
    """Judge every record afresh at the next load_records (a test that changes how kernels build)."""
    _JUDGED.clear()


def _file_state(path: Path) -> tuple:
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns


def _repository_state(now: _Now) -> tuple:
    """What a judgment reads besides the records: the commit HEAD names (and so its history), the
    working tree's files, and the variables that place the repository or stamp a copy of it."""
    from .provenance import digest_files, head

    stamps = tuple(os.environ.get(var) for var in ("ATTNLAB_ROOT", "ATTNLAB_GIT_COMMIT", "ATTNLAB_GIT_TREE",
                                                    "ATTNLAB_GIT_TIME", "ATTNLAB_GIT_DIRTY"))
    return head(), digest_files(now.files), stamps


def _judge_all(paths: list[Path], now: _Now) -> tuple[list[Assessed], list[str]]:
    loaded, problems = [], []
    for path in paths:
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            problems.append(f"{path}: unreadable ({exc})")
            continue
        item = assess(path, rec, now)
        if item.refused:
            problems.append(f"{path}: refused: " + "; ".join(item.refused))
        loaded.append(item)
    loaded.sort(key=lambda item: item.order)
    return loaded, problems


def reduce_to(rec: dict, keep) -> dict:
    """A copy of a record reduced to the kernels in `keep`: their fingerprints, bench entries and
    cases."""
    out = copy.deepcopy(rec)
    out["kernels"] = {kid: meta for kid, meta in out["kernels"].items() if kid in keep}
    if rec["kind"] == "bench":
        for case in out["cases"]:
            case["kernels"] = {kid: e for kid, e in case["kernels"].items() if kid in keep}
    else:
        out["cases"] = [c for c in out["cases"] if c["kernel"] in keep]
    return out


def as_bound(rec: dict, item: Assessed) -> dict:
    """`rec` (a copy) naming the commit it is bound to: the one whose code it ran, which a copy of
    the tree without this history may have named otherwise (the file keeps what it said)."""
    if item.commit and (rec["git"].get("commit") != item.commit or rec["git"].get("dirty") is not False):
        rec["git"] = {**rec["git"], "commit": item.commit, "dirty": False, "recorded_commit": rec["git"].get("commit")}
    return rec


def fresh_records(kind: str, root: Path | None = None, kernel_id: str | None = None) -> list[dict]:
    """Records of `kind` that may be shown (bound, physical, committed), each reduced to its fresh
    kernels, oldest commit first; with `kernel_id`, only those where that kernel is fresh."""
    loaded, _ = load_records(root)
    return [as_bound(reduce_to(item.record, item.fresh), item) for item in loaded
            if item.record.get("kind") == kind and item.fresh and (kernel_id is None or kernel_id in item.fresh)]


def fresh_bench_records(root: Path | None = None) -> list[dict]:
    return fresh_records("bench", root)


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)     # refused: fail
    stale: list[str] = field(default_factory=list)        # stale where it is the freshest: awaits a GPU run
    fresh: list[tuple[str, str, str]] = field(default_factory=list)  # (gpu, kernel, record)
    missing: list[str] = field(default_factory=list)      # registered kernels with no fresh record
    superseded: int = 0                                   # stale entries a newer fresh record replaces
    local: list[str] = field(default_factory=list)        # records of uncommitted changes: never shown

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def strict_ok(self) -> bool:
        """No refused record, and every freshest record fresh."""
        return self.ok and not self.stale


def verify(root: Path | None = None) -> Verification:
    loaded, problems = load_records(root)
    out = Verification(problems=list(problems))
    out.local = [str(item.path) for item in loaded if item.local and not item.refused]
    latest: dict[tuple[str, str, str], Assessed] = {}
    for item in loaded:  # commit order: later ones replace
        if item.shown:
            for kid in item.record["kernels"]:
                latest[(item.record["gpu"]["name"], item.record["kind"], kid)] = item
    fresh: dict[tuple[str, str], str] = {}
    for (gpu, kind, kid), item in sorted(latest.items()):
        why = item.stale[kid]
        if why:
            out.stale.append(f"{item.path}: {kid} on {gpu} ({kind}) is stale: {'; '.join(why)}: measure it again")
        else:
            fresh[(gpu, kid)] = str(item.path)
    out.fresh = [(gpu, kid, path) for (gpu, kid), path in sorted(fresh.items())]
    out.missing = [kid for kid in KERNELS if kid not in {k for _, k in fresh}]
    out.superseded = sum(1 for item in loaded if item.shown for kid, why in item.stale.items()
                         if why and latest.get((item.record["gpu"]["name"], item.record["kind"], kid)) is not item)
    return out


def report_rows(records: list[dict] | None = None, root: Path | None = None) -> list[dict]:
    """For each GPU, kernel, shape and causal flag of the fresh bench records (newer commits win):
    the kernel's median device time, the fastest SDPA backend of the same run and their ratio; a
    kernel whose output FAILED its check has no time and no ratio (median_us None)."""
    rows: dict[tuple, dict] = {}
    for rec in fresh_bench_records(root) if records is None else records:  # oldest first
        gpu = rec["gpu"]["name"]
        spec = lookup(gpu)
        matmul = rec.get("ceilings", {}).get("matmul", {}).get("tflops")
        for case in rec["cases"]:
            if not case["sdpa"]:
                continue
            best_name = min(case["sdpa"], key=lambda n: case["sdpa"][n]["median_us"])
            best = case["sdpa"][best_name]["median_us"]
            shape = Shape(*case["shape"])
            for kid, entry in case["kernels"].items():
                if "check" not in entry:
                    continue
                passed = bool(entry["check"]["passed"])
                t = entry["device"]["median_us"] if passed and "device" in entry else None
                achieved = tflops(shape, case["causal"], t) if t else None
                rows[(gpu, kid, tuple(case["shape"]), case["causal"])] = {
                    "gpu": gpu, "kernel": kid, "shape": case["shape"], "causal": case["causal"],
                    "median_us": t, "sdpa_backend": best_name, "sdpa_median_us": best,
                    "speedup_vs_sdpa": best / t if t else None, "check_passed": passed,
                    "tflops": achieved,
                    "share_of_peak": achieved / spec.fp16_tflops if spec and achieved else None,
                    "share_of_matmul": achieved / matmul if matmul and achieved else None,
                    "recorded_utc": rec["created_utc"], "commit": rec["git"]["commit"],
                }
    return [rows[k] for k in sorted(rows)]
