"""A GPU session in stages that each fit one short call on a rented GPU.

A lease gives minutes, not hours: each command may run 10 minutes, the machine goes cold between
calls, and only a few files come back. So the session is cut into stages (`STAGES`); each one
- runs its steps in child processes under a timeout, each kernel in its own process, so that one
  kernel's sticky CUDA fault or deadlock costs that kernel alone;
- stops starting steps when its own deadline passes, and says which it never started;
- writes its records to a folder of its own and packs them, the logs, the executed notebooks and
  a summary into one archive under the output folder ($OUT on the device);
- prints a short table of every failure last.

`python -m attnlab import-evidence ARCHIVE...` (attnlab.session.evidence) brings the archives into a
checkout. With `rehearse=True` every stage runs its plan on a machine without a GPU: each GPU
command is expected to refuse cleanly ("no CUDA GPU here"), which proves that the environment
imports, the registry resolves and the command lines parse; papermill runs the notebooks in their
no-GPU mode.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ..kernels import registry
from ..paths import repo_root

# What comes back from the device: at most 8 files of 16 MiB each.
MAX_ARCHIVE_BYTES = 16 * 2**20
MAX_FILES_BACK = 8
LOG_TAIL_BYTES = 256 * 1024          # each log is cut to its end in the archive
STAGE_DEADLINE_S = 7.5 * 60          # no step starts after this
HARD_END_S = 9 * 60                  # every step is killed by then: inside the 10-minute command
MIN_STEP_S = 30                      # a step with less time than this left is not started
NO_GPU_LINE = "no CUDA GPU here"     # how every GPU command of attnlab refuses without a GPU
# A CUDA fault in a child's output: the process died of its kernel, not of its Python.
FAULT_PATTERNS = re.compile(
    r"illegal memory access|illegal address|misaligned address|unspecified launch failure|"
    r"CUDA_ERROR_\w+|cudaError\w+|device-side assert|an illegal instruction", re.IGNORECASE)
SANITIZE_TOOLS = ("memcheck", "racecheck", "synccheck")


@dataclass(frozen=True)
class Step:
    """One child process of a stage."""
    name: str                               # unique in its stage; also its log's name
    argv: tuple[str, ...]
    timeout_s: float
    kernel: str | None = None               # the kernel it is about, if one
    env: tuple[tuple[str, str], ...] = ()   # set on top of the stage's environment
    gpu: bool = True                        # False: runs the same with or without a GPU
    alone: bool = False                     # True: nothing else runs meanwhile (a timing)


@dataclass
class Outcome:
    step: str
    kernel: str | None
    status: str          # ok, failed, fault, crashed, timeout, not started, no gpu
    rc: int | None
    seconds: float
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "no gpu")


@dataclass(frozen=True)
class Stage:
    name: str
    step_minutes: float  # predicted on an H100: its steps, builds aside (and not the machine's start)
    what: str
    plan: Callable[["Context"], list[Step]]
    parallel: int = 1    # children at once: 1 wherever a timing or a GPU-wide tool runs
    redirect_results: bool = True  # False: records go to results/ (the book reads them there)

    @property
    def minutes(self) -> float:
        """Predicted, with the builds the carry leaves to the GPU machine (build_seconds)."""
        return round(self.step_minutes + build_seconds(self.name)[0] / 60, 1)

    @property
    def worst_minutes(self) -> float:
        """Predicted when nothing carried is of use there: every build made on the GPU machine."""
        return round(self.step_minutes + build_seconds(self.name)[1] / 60, 1)


@dataclass
class Context:
    python: str = sys.executable
    rehearse: bool = False


def risk_order(specs=None) -> list:
    """The kernels, riskiest first: the chapters' own kernels from the last chapter down (07, 06, 05,
    then the rest), their ablations and sweep variants last."""
    specs = list(registry.select(None) if specs is None else specs)
    return sorted(specs, key=lambda s: (s.variant_of is not None, -s.chapter, s.id))


def _attnlab(ctx: Context, *args: str) -> tuple[str, ...]:
    return (ctx.python, "-m", "attnlab", *args)


# --- the stages' plans -----------------------------------------------------------------------------

def plan_check(ctx: Context) -> list[Step]:
    """The full correctness suite (every case, three seeds), one kernel per process, then the GPU
    tests but the suite itself (configured kernels, a small search, the Triton reference, ncu)."""
    steps = [Step(f"check-{s.id}", _attnlab(ctx, "check", s.id), timeout_s=150, kernel=s.id)
             for s in risk_order()]
    # Not the suite again, and not the configured kernels: that test builds the whole knob space
    # with nvcc; chapter 8's page checks every configuration its search times.
    steps.append(Step("pytest-gpu", (ctx.python, "-m", "pytest", "-v", "-m", "gpu", "-p", "no:cacheprovider",
                                     "-k", "not test_check_suite and not test_configured_kernels_pass_the_check",
                                     str(repo_root() / "tests")),
                      timeout_s=180, gpu=False, alone=True))
    return steps


# Chapter 7 measures its kernel, every ablation and fixed split of it, and the two kernels it
# replaces at the target shapes, in one run (its page compares them with each other).
CH07_TARGET_KERNELS = tuple(s.id for s in registry.select(None) if s.chapter == 7) + ("06_warp_specialized", "05_wmma")


def plan_bench(ctx: Context) -> list[Step]:
    """First each kernel launched once per mask at two shapes in its own process (a crash probe,
    several at once), then one process times every kernel that came through next to every SDPA
    backend at the mission shape and the length sweep, and one more at chapter 7's target shapes.
    bench checks every output before timing it: a wrong one gets no time."""
    from ..shapes import CH07_TARGET_SHAPES

    probes = [Step(f"probe-{s.id}", _attnlab(ctx, "check", s.id, "--probe", "--no-record"), timeout_s=90,
                   kernel=s.id) for s in risk_order()]
    ids = [s.id for s in risk_order()]
    shapes = [a for shape in CH07_TARGET_SHAPES for a in ("--shape", *map(str, shape))]
    return probes + [
        Step("bench-book", _attnlab(ctx, "bench", *ids, "--only-probed"), timeout_s=300, alone=True),
        Step("bench-ch07-targets", _attnlab(ctx, "bench", *CH07_TARGET_KERNELS, "--only-probed", *shapes),
             timeout_s=210, alone=True),
    ]


def plan_sanitize(ctx: Context) -> list[Step]:
    """memcheck (torch's caching allocator off, so an out-of-bounds read past a tail is not hidden
    inside a pooled segment), racecheck and synccheck, every kernel at small odd shapes."""
    return [Step(f"{tool}-{s.id}", _attnlab(ctx, "sanitize", s.id, "--tool", tool), timeout_s=240, kernel=s.id)
            for s in risk_order() for tool in SANITIZE_TOOLS]


# The pages that measure what no other stage does (chapter 8's timed search, the appendix's Nsight
# Compute counters and compute-sanitizer runs, the scoreboard with the Triton reference): the
# extras stage runs them.
MEASURING_PAGES = ("ch08_search", "appendix_profiling", "ch09_scoreboard")


def _page_step(ctx: Context, stem: str) -> Step:
    """One page through tools/run_book.py with its default parameters (what nbval re-executes them
    with: a cell that prints a parameter's effect must match), saving the records it makes. Its
    quick settings keep it inside the step's timeout; where a page reuses the session's records,
    those are the full runs of the check and bench stages."""
    run_book = str(repo_root() / "tools" / "run_book.py")
    return Step(f"book-{stem}", (ctx.python, run_book, stem, "--save-results"), timeout_s=300, gpu=False,
                alone=True, env=(("ATTNLAB_REUSE_RECORDS", "1"),))


def _pages() -> list[str]:
    sys.path.insert(0, str(repo_root() / "tools"))
    try:
        from run_book import book_notebooks
    finally:
        sys.path.pop(0)
    return [nb.stem for nb in book_notebooks()]


def plan_book(ctx: Context) -> list[Step]:
    """Every other page executed by papermill, one page per process; on the
    GPU a page takes its check and timings from this commit's fresh records of the same GPU where
    they exist (ATTNLAB_REUSE_RECORDS: the check and bench stages wrote them minutes earlier)
    rather than measuring a second time, and measures live otherwise."""
    # The records the earlier stages of this machine made (still under its TMPDIR while it stays
    # warm) go into results/ first, so that the pages reuse them without a round trip through
    # import-evidence between two calls; import-evidence judges every one of them later anyway.
    adopt = Step("book-adopt-records", (ctx.python, "-m", "attnlab.session.stages", "--adopt-records"),
                 timeout_s=60, gpu=False, alone=True)
    counts = Step("book-counts", (ctx.python, "-m", "attnlab.book.executor_view"), timeout_s=300, gpu=False,
                  alone=True)  # the pages' executor counts, every core at once, before the pages read them
    return [adopt, counts] + [_page_step(ctx, stem) for stem in _pages() if stem not in MEASURING_PAGES]


def session_root() -> Path:
    """Where each stage keeps its work (logs, redirected records) on the GPU machine."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / "attnlab-session"


def adopt_records(root: Path | None = None, results: Path | None = None) -> list[Path]:
    """Copy the records the other stages left under `root` (session_root()) into `results`
    (results/), keeping their paths under results/; a record already there is left alone."""
    from ..paths import results_dir

    root, results = root or session_root(), results or results_dir()
    taken = []
    for stage in STAGES:
        folder = root / stage.name / "results"
        for path in sorted(folder.rglob("*.json")) if folder.is_dir() else []:
            target = results / path.relative_to(folder)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
                taken.append(target)
    return taken


def plan_extras(ctx: Context) -> list[Step]:
    """The measuring pages, executed by papermill: chapter 8's timed search of 07_mma, the appendix's
    Nsight Compute counters and sanitizer runs, the scoreboard (every kernel, the Triton reference)."""
    pages = _pages()
    return [_page_step(ctx, stem) for stem in MEASURING_PAGES if stem in pages]


# What each stage's children import and run: a missing one fails the prepare step, the first of
# every stage, on the device and in the rehearsal alike (where the GPU commands stop early).
STAGE_NEEDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # stage: (modules, GPU programs)
    "check": (("torch", "cupy", "numpy", "tqdm", "pytest", "triton", "attnlab.gpu.check", "attnlab.gpu.launch",
               "attnlab.reference", "attnlab.kernels.compile", "attnlab.gpu.search", "attnlab.gpu.triton_ref"), ()),
    "bench": (("torch", "cupy", "numpy", "tqdm", "triton", "attnlab.gpu.bench", "attnlab.gpu.check",
               "attnlab.gpu.launch", "attnlab.gpu.triton_ref", "attnlab.records.results"), ()),
    "sanitize": (("torch", "cupy", "attnlab.gpu.sanitize", "attnlab.gpu.launch"), ("compute-sanitizer",)),
    "extras": (("torch", "cupy", "triton", "matplotlib", "yaml", "nbformat", "nbclient", "papermill", "ipykernel",
                "IPython", "myst_nb", "attnlab.book.page", "attnlab.gpu.profile", "attnlab.gpu.search",
                "attnlab.book.scoreboard", "attnlab.gpu.triton_ref"), ("ncu", "compute-sanitizer")),
    "book": (("torch", "cupy", "numpy", "matplotlib", "tqdm", "yaml", "nbformat", "nbclient", "papermill",
              "ipykernel", "IPython", "nbval", "jupytext", "myst_nb", "attnlab.book.page", "attnlab.book.plot",
              "attnlab.executor.cpu"), ()),
}
# Programs the pages run with or without a GPU: nvcc and cuobjdump for the static inspection, the
# host compiler for the CPU executor.
STAGE_TOOLS: dict[str, tuple[str, ...]] = {"extras": ("nvcc", "cuobjdump"), "book": ("nvcc", "cuobjdump", "g++")}


def _tool_missing(name: str) -> bool:
    # nvcc and cuobjdump are found where attnlab.kernels.toolchain looks (the environment's CUDA wheels, or
    # the image's toolkit with ATTNLAB_NVCC=system), not necessarily on PATH.
    if name in ("nvcc", "cuobjdump"):
        from ..kernels.toolchain import ToolMissing, cuobjdump, nvcc
        try:
            (nvcc if name == "nvcc" else cuobjdump)()
        except ToolMissing:
            return True
        return False
    return shutil.which(name) is None


# What each stage's steps load or read of nvcc's builds (attnlab.session.prebuild's sets). The first step
# unpacks what was carried and builds the rest, every core at once, before anything is measured.
STAGE_BUILDS: dict[str, tuple[str, ...]] = {
    "check": ("registered",),
    "bench": ("registered",),
    "sanitize": ("registered",),
    "extras": ("registered", "searched", "static_reports"),  # chapter 8's timed search and static spaces
    "book": ("registered", "inspected"),                      # the chapters' inspect cells, every target
}


@functools.lru_cache(maxsize=None)
def build_seconds(stage: str, arch: str = "sm_90") -> tuple[float, float]:
    """Predicted seconds of the stage's builds on the GPU machine: with the carry found there (what
    is not carried), and without it (everything: that machine's nvcc is another build than the one
    that made the carry)."""
    from . import prebuild

    wanted = prebuild.builds(STAGE_BUILDS[stage], arch)
    carried = {b.identity for b in prebuild.carried(arch)}
    missing = [b for b in wanted if b.identity not in carried]
    return prebuild.predicted_seconds(len(missing)), prebuild.predicted_seconds(len(wanted))


def _unpack_carry() -> list[str]:
    """The prebuilt archives the call carried, into attnlab's cache; one note each."""
    from ..kernels.toolchain import nvcc_version
    from ..paths import cache_dir
    from . import carry

    notes = []
    for archive in carry.carried_archives():
        try:
            manifest = carry.unpack(archive, cache_dir())
        except Exception as exc:  # noqa: BLE001 - no lzma, a damaged file: the builds are made here instead
            notes.append(f"{archive.name} not unpacked ({type(exc).__name__}: {exc}): its builds are made here")
            continue
        note = f"unpacked {archive.name}: {len(manifest['files'])} files built by nvcc {manifest['nvcc']}"
        if manifest["nvcc"] != nvcc_version():
            note += f"; this machine's nvcc is {nvcc_version()}, so every build is made here"
        notes.append(note)
    return notes


def prepare(stage: str, arch: str | None = None, workers: int | None = None) -> tuple[list[str], list[str]]:
    """Make the stage ready before it measures anything, and say what would make it fail: a module
    that does not import, a program not on PATH (on a GPU machine only), a build that nvcc refuses.
    The carried builds are unpacked into attnlab's cache and the stage's other builds are made
    (attnlab.session.prebuild), so that no step waits on nvcc. Returns (problems, notes)."""
    import importlib

    from ..env import has_gpu
    from ..kernels.compile import backend
    from . import prebuild

    modules, programs = STAGE_NEEDS[stage]
    problems, notes = [], []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
            problems.append(f"import {name}: {type(exc).__name__}: {exc}")
    gpu = has_gpu()
    tools = STAGE_TOOLS.get(stage, ()) + (programs if gpu else ())
    problems += [f"{p} is not on PATH" for p in tools if _tool_missing(p)]
    if arch is None and gpu:
        from ..kernels.compile import _device_arch, _device_index
        arch = _device_arch(_device_index())
    if arch and (not gpu or backend() == "nvcc"):
        if _tool_missing("nvcc"):
            return problems + ["no nvcc to build with (ATTNLAB_NVCC=system on a GPU image)"], notes
        notes += _unpack_carry()
        wanted = prebuild.builds(STAGE_BUILDS[stage], arch)
        tried, refused, seconds = prebuild.build_missing(wanted, workers, progress=False)
        targets = ", ".join(sorted({b.arch for b in wanted}))
        notes.append(f"{len(wanted) - len(tried)} of {len(wanted)} builds ({targets}) found in the cache; "
                     f"{len(tried) - len(refused)} built here in {seconds:.0f} s on {workers or os.cpu_count()} cores")
        problems += [f"nvcc refused {line}" for b, line in refused.items() if b.required]
        notes += [f"nvcc refused {line} (the static gate's verdict on it)" for b, line in refused.items()
                  if not b.required]
    return problems, notes


def _prepare_step(ctx: Context, stage: str) -> Step:
    argv = ((ctx.python, "-m", "attnlab.session.stages", "--prepare", stage)
            + (("--arch", "sm_90") if ctx.rehearse else ()))
    return Step("prepare", argv, timeout_s=300, gpu=False, alone=True)


STAGES: tuple[Stage, ...] = (
    Stage("check", 4.0, "the correctness suite, every kernel in its own process (3 at once), riskiest first; "
                        "then the other GPU tests", plan_check, parallel=3),
    Stage("bench", 4.5, "a crash probe per kernel (4 at once), then timings next to every SDPA backend: "
                        "the mission shape, the sweep, chapter 7's targets", plan_bench, parallel=4),
    Stage("sanitize", 4.0, "memcheck (no caching allocator), racecheck, synccheck on every kernel at small "
                           "odd shapes, 6 processes at once", plan_sanitize, parallel=6),
    Stage("extras", 6.5, "chapter 8's timed search, Nsight Compute counters and the scoreboard with the Triton "
                         "reference: their pages executed by papermill", plan_extras, redirect_results=False),
    Stage("book", 6.5, "the records earlier stages left on this machine into results/, the pages' CPU-executor "
                       "counts on every core, then every other page executed by papermill, reusing this "
                       "commit's fresh records", plan_book, redirect_results=False),
)


def get_stage(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise KeyError(f"no stage {name!r}; stages: {', '.join(s.name for s in STAGES)}")


def list_text() -> str:
    from .prebuild import DEVICE_CORES

    width = max(len(s.name) for s in STAGES)
    lines = [f"{s.name:<{width}}  ~{s.minutes:g} min on an H100  {s.what}" for s in STAGES]
    lines.append(f"{'total':<{width}}  ~{sum(s.minutes for s in STAGES):g} min of steps (each call also "
                 "pays the machine's start when it comes cold)")
    waits = ", ".join(f"{s.name} {build_seconds(s.name)[0]:.0f} s" for s in STAGES)
    worst = ", ".join(f"{s.name} {build_seconds(s.name)[1]:.0f} s" for s in STAGES)
    lines.append(f"builds on the GPU machine, included above (predicted, {DEVICE_CORES} cores): {waits}; "
                 f"if its nvcc is not the carry's: {worst} (~{sum(s.worst_minutes for s in STAGES):g} min in all)")
    return "\n".join(lines)


# --- running steps -----------------------------------------------------------------------------------

def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def classify(rc: int | None, timed_out: bool, text: str, rehearse: bool, gpu: bool) -> str:
    """What happened to a child: its exit status read with what it printed."""
    if timed_out:
        return "timeout"
    if rc is None:
        return "not started"
    if rc < 0:
        return "fault" if FAULT_PATTERNS.search(text) else "crashed"
    if rc == 0:
        return "ok"
    if rehearse and gpu and rc == 2 and NO_GPU_LINE in text:
        return "no gpu"
    return "fault" if FAULT_PATTERNS.search(text) else "failed"


def run_step(step: Step, log_dir: Path, base_env: dict, rehearse: bool = False,
             hard_end: float | None = None) -> Outcome:
    """Run one child in a session of its own; past its timeout (and never past `hard_end`, a
    time.monotonic()) the child and every process under it are killed (compute-sanitizer, ncu and
    a Jupyter kernel start children of their own, some in sessions of their own).
    ATTNLAB_SESSION_TIMEOUT_SCALE stretches every timeout (a rehearsal on a CPU is slower than the
    GPU at what the pages do)."""
    log_path = log_dir / f"{step.name}.log"
    timeout = step.timeout_s * float(base_env.get("ATTNLAB_SESSION_TIMEOUT_SCALE", "1"))
    if hard_end is not None:
        timeout = min(timeout, hard_end - time.monotonic())
    t0 = time.monotonic()
    env = {**base_env, **dict(step.env)}
    with open(log_path, "wb") as log:
        log.write(("$ " + " ".join(step.argv) + "\n").encode())
        log.flush()
        try:
            proc = subprocess.Popen(step.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=repo_root(), start_new_session=True)
        except OSError as exc:
            log.write(f"could not start: {exc}\n".encode())
            return Outcome(step.name, step.kernel, "failed", None, 0.0, f"could not start: {exc}")
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.returncode
    text = log_path.read_text(errors="replace")
    status = classify(rc, timed_out, text, rehearse, step.gpu)
    tail = f"no exit after {timeout:g} s: killed" if timed_out else _tail(text)
    return Outcome(step.name, step.kernel, status, rc, round(time.monotonic() - t0, 1), tail)


def _kill_group(proc: subprocess.Popen) -> None:
    """The child's process group and every descendant, wherever it moved (a Jupyter kernel runs in
    a session of its own, and an ncu or compute-sanitizer it started would outlive the command)."""
    try:
        import psutil
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil, or the child is gone: the group is what is left
        descendants = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in descendants:
            try:
                p.send_signal(sig)
            except Exception:  # noqa: BLE001 - already gone
                pass
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
            if not any(_alive(p) for p in descendants):
                return
        except subprocess.TimeoutExpired:
            continue


def _alive(p) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:  # noqa: BLE001
        return False


def run_steps(steps: list[Step], log_dir: Path, base_env: dict, parallel: int = 1, rehearse: bool = False,
              deadline: float | None = None, on_done: Callable[[Outcome], None] | None = None,
              hard_end: float | None = None) -> list[Outcome]:
    """Every step, `parallel` at a time, none started after `deadline` or with less than MIN_STEP_S
    left before `hard_end` (both time.monotonic()); the outcomes in the steps' order."""
    def one(step: Step) -> Outcome:
        now = time.monotonic()
        if (deadline is not None and now > deadline) or (hard_end is not None and hard_end - now < MIN_STEP_S):
            out = Outcome(step.name, step.kernel, "not started", None, 0.0, "the stage's time was up")
        else:
            out = run_step(step, log_dir, base_env, rehearse, hard_end)
        if on_done:
            on_done(out)
        return out

    outcomes: list[Outcome] = []
    i = 0
    while i < len(steps):  # consecutive steps that may share the GPU run together; a lone one alone
        j = i + 1
        while j < len(steps) and steps[j].alone == steps[i].alone and not steps[i].alone:
            j += 1
        with ThreadPoolExecutor(max_workers=1 if steps[i].alone else max(1, parallel)) as pool:
            outcomes += pool.map(one, steps[i:j])
        i = j
    return outcomes


# --- a whole stage -----------------------------------------------------------------------------------

@dataclass
class StageRun:
    stage: str
    outcomes: list[Outcome] = field(default_factory=list)
    archives: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]


def run_stage(name: str, out_dir: Path, work_root: Path | None = None, rehearse: bool = False,
              steps: list[Step] | None = None, deadline_s: float = STAGE_DEADLINE_S,
              hard_end_s: float | None = None, echo: Callable[[str], None] = print) -> StageRun:
    """Run one stage and pack its archive(s) into `out_dir`, after every step (what is under $OUT
    comes back even when the command is killed) and at the end. `steps` replaces the stage's plan
    (tests). No step runs past `hard_end_s` (default: HARD_END_S, or 90 s past a longer deadline)."""
    import threading
    from ..env import nvidia_smi
    from ..records.provenance import describe_now

    stage = get_stage(name)
    ctx = Context(rehearse=rehearse)
    work = (work_root or session_root()) / name
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["ATTNLAB_ROOT"] = str(repo_root())
    env["ATTNLAB_SESSION_WORK"] = str(work)
    results_before = _results_snapshot()
    pages_before = _pages_snapshot()
    partial_before = _partial_snapshot()
    if stage.redirect_results:
        env["ATTNLAB_RESULTS"] = str(work / "results")
    plan = [_prepare_step(ctx, name), *stage.plan(ctx)] if steps is None else steps
    run = StageRun(name)
    minutes = stage.minutes  # before the clock starts: it reads every kernel's sources
    t0 = time.monotonic()
    hard_end = t0 + (hard_end_s if hard_end_s is not None else max(HARD_END_S, deadline_s + 90))
    echo(f"== stage {name}: {len(plan)} steps, {stage.parallel} at a time, predicted ~{minutes:g} min")
    header = {"stage": name, "rehearsal": rehearse, "gpu": nvidia_smi("name") or "none", "git": describe_now(),
              "predicted_minutes": minutes}
    finished: list[Outcome] = []
    lock = threading.Lock()

    def collect(outcomes: list[Outcome], final: bool) -> None:
        """Everything made so far into the archive; steps not yet finished are listed as such."""
        if not stage.redirect_results:
            _copy_new_results(results_before, work / "results")
        _copy_changed_pages(pages_before, work / "book")
        _copy_changed_pages(partial_before, work / "failed-pages", _partial_snapshot)
        summary = {**header, "complete": final, "seconds": round(time.monotonic() - t0, 1),
                   "finished_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   "steps": [asdict(o) for o in outcomes]}
        (work / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        archives = pack(work, out_dir, name)
        for stale in set(out_dir.glob(f"{name}.*tar.gz")) - set(archives):  # an earlier split
            stale.unlink()
        run.archives = archives

    def done(o: Outcome) -> None:
        echo(f"   {o.status:<11} {o.seconds:6.1f} s  {o.step}")
        with lock:
            finished.append(o)
            collect(list(finished), final=False)

    run.outcomes = run_steps(plan, work / "logs", env, stage.parallel, rehearse, t0 + deadline_s, done, hard_end)
    run.seconds = round(time.monotonic() - t0, 1)
    collect(run.outcomes, final=True)
    echo(failure_table(run))
    return run


def _results_snapshot() -> set[Path]:
    from ..paths import results_dir

    root = results_dir()
    return set(root.rglob("*.json")) if root.exists() else set()


def _copy_new_results(before: set[Path], dest: Path) -> None:
    from ..paths import results_dir

    root = results_dir()
    for path in sorted(_results_snapshot() - before):
        target = dest / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def _pages_snapshot() -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in (repo_root() / "book").glob("*.ipynb")}


def _partial_snapshot() -> dict[Path, bytes | None]:
    """tools/run_book.py leaves a failed page's partial output here (None: not there yet)."""
    folder = repo_root() / "_build" / "run_book"
    return {p: p.read_bytes() for p in folder.glob("*.ipynb")} if folder.exists() else {}


def _copy_changed_pages(before: dict, dest: Path, now: Callable[[], dict] = _pages_snapshot) -> None:
    """The pages that changed during the stage: those tools/run_book.py rewrote (it writes back only
    a page that ran without error), or the partial output of a page that failed."""
    for path, data in now().items():
        if before.get(path) != data:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / path.name)


def _archived_bytes(path: Path) -> bytes:
    """A file as it goes into the archive: a log cut to its last LOG_TAIL_BYTES (the file itself is
    left alone: a running step may still be writing it)."""
    data = path.read_bytes()
    if path.suffix == ".log" and len(data) > LOG_TAIL_BYTES:
        return f"[... {len(data) - LOG_TAIL_BYTES} bytes cut ...]\n".encode() + data[-LOG_TAIL_BYTES:]
    return data


def pack(work: Path, out_dir: Path, name: str) -> list[Path]:
    """`work` as <name>.tar.gz under `out_dir`; split into <name>.1.tar.gz, <name>.2.tar.gz... only
    if one archive would pass MAX_ARCHIVE_BYTES. Every part holds the summary.json, which
    import-evidence reads first."""
    import io

    out_dir.mkdir(parents=True, exist_ok=True)
    summary = work / "summary.json"
    head = [(summary, summary.read_bytes())] if summary.is_file() else []
    files = [(p, _archived_bytes(p)) for p in sorted(work.rglob("*")) if p.is_file() and p != summary]
    groups, current, size = [], [], 0
    # Compressed output is smaller than its input; keep a margin anyway.
    budget = MAX_ARCHIVE_BYTES * 0.9 - sum(len(d) for _, d in head)
    for path, data in files:
        if current and size + len(data) > budget:
            groups.append(current)
            current, size = [], 0
        current.append((path, data))
        size += len(data)
    groups.append(current)
    groups = [head + group for group in groups]
    archives = []
    for i, group in enumerate(groups, 1):
        target = out_dir / (f"{name}.tar.gz" if len(groups) == 1 else f"{name}.{i}.tar.gz")
        partial = target.with_name(target.name + ".part")
        with tarfile.open(partial, "w:gz") as tar:
            for path, data in group:
                info = tarfile.TarInfo(f"{name}/{path.relative_to(work).as_posix()}")
                info.size, info.mtime = len(data), int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
        partial.replace(target)  # a command killed mid-write leaves the previous archive whole
        if target.stat().st_size > MAX_ARCHIVE_BYTES:
            raise RuntimeError(f"{target} is {target.stat().st_size} bytes, over the {MAX_ARCHIVE_BYTES} that "
                               "come back from the device")
        archives.append(target)
    return archives


def check_out(out_dir: Path) -> list[str]:
    """What the device tool would not bring back from `out_dir`: more than MAX_FILES_BACK files, a
    file over MAX_ARCHIVE_BYTES, a name of other characters than letters, digits, '.', '_', '-',
    a folder more than two down; and any archive without its stage's summary.json."""
    problems = []
    files = [p for p in out_dir.rglob("*") if p.is_file()]
    if len(files) > MAX_FILES_BACK:
        problems.append(f"{len(files)} files in {out_dir}, over the {MAX_FILES_BACK} that come back")
    for path in files:
        rel = path.relative_to(out_dir)
        if len(rel.parts) > 3:
            problems.append(f"{rel}: more than two folders down")
        if any(not re.fullmatch(r"[A-Za-z0-9._-]+", part) for part in rel.parts):
            problems.append(f"{rel}: a name with other characters than letters, digits, '.', '_', '-'")
        if path.stat().st_size > MAX_ARCHIVE_BYTES:
            problems.append(f"{rel}: {path.stat().st_size} bytes, over {MAX_ARCHIVE_BYTES}")
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path) as tar:
                names = tar.getnames()
            stage = path.name.split(".")[0]
            if f"{stage}/summary.json" not in names:
                problems.append(f"{rel}: no {stage}/summary.json inside")
            if any(not n.startswith(f"{stage}/") for n in names):
                problems.append(f"{rel}: entries outside {stage}/")
    return problems


def isolation_demo(work: Path) -> list[Outcome]:
    """Three children through the stage machinery: one that hangs, one that dies the way a CUDA
    fault kills a process (the runtime's message, then abort), one that succeeds after both."""
    py = sys.executable
    steps = [
        Step("hangs", (py, "-c", "import time; print('waiting forever', flush=True); time.sleep(3600)"), 3),
        Step("faults", (py, "-c", "import os, sys; print('CUDA error: an illegal memory access was "
                                  "encountered', file=sys.stderr, flush=True); os.abort()"), 30),
        Step("after-both", (py, "-c", "print('still running')"), 30),
    ]
    (work / "logs").mkdir(parents=True, exist_ok=True)
    return run_steps(steps, work / "logs", dict(os.environ))


def failure_table(run: StageRun) -> str:
    """The stage's last words: counts, then one line per failure (the reply shows only the tail)."""
    counts: dict[str, int] = {}
    for o in run.outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    lines = [f"== stage {run.stage}: {run.seconds:.0f} s; " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())),
             "   archives: " + ", ".join(f"{a.name} ({a.stat().st_size // 1024} KiB)" for a in run.archives)]
    if run.failures:
        lines.append(f"   {'status':<11} {'step':<34} last line")
        for o in run.failures:
            last = (o.tail.strip().splitlines() or [""])[-1][:110]
            lines.append(f"   {o.status:<11} {o.step:<34} {last}")
    else:
        lines.append("   no failures")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m attnlab.session.stages", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", nargs="?", help="one of: " + ", ".join(s.name for s in STAGES))
    p.add_argument("--list", action="store_true", help="the stages, with what each does and its minutes")
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="where archives go (default: $OUT)")
    p.add_argument("--rehearse", action="store_true", help="no GPU here: a GPU command that refuses cleanly passes")
    p.add_argument("--deadline", type=float, default=STAGE_DEADLINE_S,
                   help="seconds after which no step starts (default: %(default)s)")
    p.add_argument("--prepare", metavar="STAGE", help="only make STAGE ready: check its modules and programs, "
                                                       "unpack the carried builds and build what it needs")
    p.add_argument("--arch", help="with --prepare: the target to build for (default: the GPU's)")
    p.add_argument("--adopt-records", action="store_true",
                   help="copy the records earlier stages of this machine made into results/ (the book stage's first step)")
    p.add_argument("--isolation-demo", action="store_true",
                   help="show a hanging child and a faulting one recorded while the stage goes on")
    p.add_argument("--check-out", metavar="DIR", help="check that DIR would come back from the GPU machine whole")
    args = p.parse_args(argv)
    if args.isolation_demo:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            outcomes = isolation_demo(Path(tmp))
        for o in outcomes:
            print(f"{o.step:<11} {o.status:<8} {o.seconds:5.1f} s  {o.tail.splitlines()[-1] if o.tail else ''}")
        want = ["timeout", "fault", "ok"]
        got = [o.status for o in outcomes]
        print("process isolation " + ("ok" if got == want else f"FAILED: {got}, expected {want}"))
        return 0 if got == want else 1
    if args.adopt_records:
        taken = adopt_records()
        print(f"{len(taken)} records of earlier stages on this machine taken into results/")
        return 0
    if args.check_out:
        problems = check_out(Path(args.check_out))
        for line in problems:
            print(f"FAIL {line}", file=sys.stderr)
        files = sorted(p.name for p in Path(args.check_out).rglob("*") if p.is_file())
        print(f"{args.check_out}: {len(files)} files ({', '.join(files)}); "
              + ("all come back" if not problems else f"{len(problems)} problems"))
        return 1 if problems else 0
    if args.prepare:
        problems, notes = prepare(args.prepare, args.arch)
        for line in notes:
            print(line)
        for line in problems:
            print(f"MISSING {line}", file=sys.stderr)
        print(f"prepare {args.prepare}: {'ok' if not problems else f'{len(problems)} problems'}")
        return 1 if problems else 0
    if args.list or not args.stage:
        print(list_text())
        return 0
    try:
        get_stage(args.stage)
    except KeyError as exc:
        print(f"attnlab.session.stages: {exc.args[0]}", file=sys.stderr)
        return 2
    run = run_stage(args.stage, Path(args.out).resolve(), rehearse=args.rehearse, deadline_s=args.deadline,
                    echo=lambda line: print(line, flush=True))
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
