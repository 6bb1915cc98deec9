"""A kernel edit weighed by the book's time model before it becomes a step: the same kernels, shapes
and GPUs predicted with kernels/ as it is here and with the edit (a patch) applied to a scratch copy
of it, side by side.

    python -m attnlab weigh EDIT.patch 07_mma_deferred_pv --gpu "H100 SXM" --shape 2 16 4096 128

Each side runs in its own process with ATTNLAB_ROOT at its copy of the kernels, so every build,
trace and SASS listing is the copy's own (the caches are keyed by content: the copy shares what did
not change). Per case a side gives the predicted time and what bounds it, the launch (entry, grid,
block) and its registers, ptxas's spills, and the model's own counts per CTA where it gives an
issue bound: the warp instructions a CTA issues and the cycles the stalls of its key-tile loop hold
its warps (attnlab.model.issue). Before predicting, the edited kernels run the CPU check at two
small shapes with each GPU's tiles (attnlab.executor.cpu): an edit that breaks a kernel is refused,
not weighed. Every number is a prediction or a count of a binary, never a time: a GPU's run
decides whether the edit stays.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ..paths import kernels_dir, repo_root
from ..shapes import Shape

# The CPU check the edited kernels must pass before they are weighed: a ragged key tile, both head dims.
CHECK_SHAPES = (Shape(1, 2, 129, 64), Shape(1, 2, 129, 128))


class EditRefused(Exception):
    """The patch cannot be weighed: git cannot read it, it touches more than kernels/, or it does not
    apply to kernels/ as it is."""


class EditFails(EditRefused):
    """The edited kernels do not build, or fail the CPU check: weighing them would predict a wrong kernel."""


@dataclass(frozen=True)
class Side:
    """One kernel at one case with one copy of the kernels: predictions and counts of the binary."""
    time_us: float
    bound: str
    entry: str
    grid: tuple
    block: tuple
    registers: int
    spill_bytes: int              # ptxas's spill stores and loads of the entry
    # The model's own counts, per CTA on average (None where it gives no issue bound: issue.LoopShape.why_not):
    issued: float | None          # warp instructions a CTA issues (the issue bound's)
    loop_stalled: float | None    # the cycles the stalls of its key-tile loop hold its warps (the latency bound's)


@dataclass(frozen=True)
class Row:
    kernel: str
    shape: tuple
    causal: bool
    gpu: str
    base: Side
    edit: Side

    @property
    def ratio(self) -> float:
        """The edit's predicted time over the base's: below 1, the model predicts the edit faster."""
        return self.edit.time_us / self.base.time_us


def _first_line(text: str, default: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), default)


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """git run in `cwd` as if no repository were around it (cwd's parent is the ceiling, and the
    variables that name a repository are dropped), so that a patch's paths are read as written and
    never shifted to a subdirectory of a repository the command happens to run in."""
    if shutil.which("git") is None:
        raise EditRefused("git is needed to read and apply the patch, and is not on PATH")
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          env={**env, "GIT_CEILING_DIRECTORIES": str(Path(cwd).resolve().parent)})


def patched_files(patch: Path) -> list[str]:
    """The files `patch` changes (its paths, a/ and b/ taken off). EditRefused where it names one
    outside kernels/ (or in a folder of it) or is not a patch git can read."""
    with tempfile.TemporaryDirectory(prefix="attnlab-weigh-") as empty:
        proc = _git(["apply", "--numstat", str(Path(patch).resolve())], Path(empty))
    if proc.returncode:
        raise EditRefused(f"{patch}: not a patch git can read ({_first_line(proc.stderr, 'no message')})")
    files = [line.split("\t", 2)[2] for line in proc.stdout.splitlines() if line.strip()]
    if not files:
        raise EditRefused(f"{patch}: changes no file")
    outside = [f for f in files if not f.startswith("kernels/") or "/" in f[len("kernels/"):]]
    if outside:
        raise EditRefused(f"{patch}: changes {outside[0]}, outside kernels/ (only kernel sources are weighed)")
    return files


def edited_copy(patch: Path, dest: Path) -> Path:
    """dest: a root holding a copy of kernels/ with `patch` applied, and src/ as it is here (a link:
    a kernel may name a Python file among its sources, and a patch never changes one)."""
    patched_files(patch)
    dest.mkdir(parents=True)
    shutil.copytree(kernels_dir(), dest / "kernels")
    (dest / "src").symlink_to(repo_root() / "src", target_is_directory=True)
    proc = _git(["apply", str(Path(patch).resolve())], dest)
    if proc.returncode:
        raise EditRefused(f"{patch}: does not apply to kernels/ as it is here ({_first_line(proc.stderr, 'no message')})")
    return dest


def weigh(patch: Path, kernels: list[str], shapes: list[Shape], gpus: list[str],
          causals=(False, True)) -> list[Row]:
    """Every (kernel, shape, causal, GPU) predicted without and with `patch`, in that order."""
    request = {"kernels": kernels, "shapes": [list(s) for s in shapes], "gpus": gpus, "causals": list(causals)}
    with tempfile.TemporaryDirectory(prefix="attnlab-weigh-") as tmp:
        root = edited_copy(patch, Path(tmp) / "edit")
        edit = _measure(root, request, check=True)
    base = _measure(repo_root(), request, check=False)

    def side(d: dict) -> Side:  # JSON brought the launch's tuples back as lists
        return Side(**{**d, "grid": tuple(d["grid"]), "block": tuple(d["block"])})

    return [Row(k, tuple(s), c, g, side(b), side(e)) for (k, s, c, g, b), (_, _, _, _, e) in zip(base, edit, strict=True)]


def _measure(root: Path, request: dict, check: bool) -> list:
    """One side's rows: this module's _main in a process whose kernels are root's."""
    cmd = [sys.executable, "-m", "attnlab.model.weigh", json.dumps({**request, "check": check})]
    env = {**os.environ, "ATTNLAB_ROOT": str(root)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode == 3:
        raise EditFails(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "the edited kernels fail")
    if proc.returncode:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"weighing {'the edit' if check else 'kernels/'} failed: {tail[0]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _side(kernel: str, shape: Shape, causal: bool, gpu: str) -> dict:
    from ..gpus import by_key
    from ..kernels import registry
    from ..kernels.static import inspect_kernel
    from .bounds import counted, predict, warp_instructions, warp_stalls

    spec_gpu = by_key(gpu)
    spec = registry.get(kernel, spec_gpu.arch)
    cfg = spec.launch_config(shape, spec_gpu.sms)
    entry = cfg.get("entry", spec.entry)
    t = counted(kernel, shape, causal, spec_gpu)
    p = predict(kernel, shape, causal, gpu, t=t)
    # the launched entry's resources, as bounds.launch_registers reads them (0 where the build lists none)
    own = next((f for f in inspect_kernel(spec, spec_gpu.arch).functions if f.name == entry), None)
    issued, loop = warp_instructions(t, kernel, spec_gpu)
    stalled = None if issued is None else warp_stalls(t, loop)
    return asdict(Side(p.time_us, p.bottleneck, entry, tuple(cfg["grid"]), tuple(cfg["block"]),
                       own.registers if own else 0, (own.spill_stores + own.spill_loads) if own else 0,
                       None if issued is None else float(issued.mean()),
                       None if stalled is None else float(stalled.mean())))


def _check(kernels: list[str], arches: list[str]) -> str | None:
    """The first failure of the CPU check (executor.cpu.run_suite_cpu) of `kernels`, with the tiles each
    of `arches` gives them, at CHECK_SHAPES (those each takes), with and without the mask, seed 0;
    None if all pass."""
    from ..executor.cpu import cpu_label, run_suite_cpu
    from ..kernels import registry

    # one spec per distinct tiling (a kernel whose tiles do not follow the target is checked once)
    specs = {cpu_label(registry.get(kid, a), a): registry.get(kid, a) for kid in kernels for a in arches}
    cases = run_suite_cpu(list(specs.values()), shapes=CHECK_SHAPES, seeds=(0,), progress=False, labels=list(specs))
    failed = next((c for c in cases if not c.passed), None)
    if failed is None:
        return None
    return (f"the edited {failed.kernel} fails the CPU check at {Shape(*failed.shape).label()}"
            f"{' causal' if failed.causal else ''}: {failed.reason}")


def _main(argv) -> int:
    """python -m attnlab.model.weigh REQUEST: one side's rows as JSON on the last line. On the edit's
    side (REQUEST's "check"), kernels that fail the CPU check or do not build end it with exit 3,
    the reason on the last line."""
    from ..executor.build import ExecutorBuildError
    from ..gpus import by_key
    from ..kernels.compile import KernelBuildError

    request = json.loads(argv[0])
    arches = list(dict.fromkeys(by_key(g).arch for g in request["gpus"]))
    check = request.pop("check")
    try:
        if check and (problem := _check(request["kernels"], arches)):
            print(problem)
            return 3
        rows = [(k, s, c, g, _side(k, Shape(*s), c, g)) for k in request["kernels"] for s in request["shapes"]
                for c in request["causals"] for g in request["gpus"]]
    except (ExecutorBuildError, KernelBuildError) as exc:
        if not check:
            raise
        log = str(exc)
        error = next((line.strip() for line in log.splitlines() if "error" in line), _first_line(log, "no log"))
        print(f"the edited kernels do not build ({type(exc).__name__}): {error}")
        return 3
    print(json.dumps(rows))
    return 0


def format_rows(rows: list[Row]) -> str:
    """One line per case: each side's predicted time and bound, their ratio, and each side's
    registers, spills, instructions and loop stall cycles ("base -> edit")."""
    def pair(b, e) -> str:
        return f"{b} -> {e}"

    def count(x: float | None) -> str:
        return "-" if x is None else f"{x:,.0f}"

    table = [["kernel", "shape", "causal", "GPU", "predicted us", "edit/base", "bound", "registers", "spill bytes",
              "instructions per CTA", "loop stall cycles per CTA"]]
    for r in rows:
        b, e = r.base, r.edit
        table.append([r.kernel, Shape(*r.shape).label(), str(r.causal), r.gpu, pair(f"{b.time_us:.2f}", f"{e.time_us:.2f}"),
                      f"{r.ratio:.3f}", b.bound if b.bound == e.bound else pair(b.bound, e.bound),
                      pair(b.registers, e.registers), pair(b.spill_bytes, e.spill_bytes), pair(count(b.issued), count(e.issued)),
                      pair(count(b.loop_stalled), count(e.loop_stalled))])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.append("Each pair is kernels/ as it is -> with the edit. Predictions of the book's time model and counts "
                 "of the binaries, not measurements: a GPU's run decides. The edited kernels passed the CPU check "
                 "with each GPU's tiles at " + " and ".join(s.label() for s in CHECK_SHAPES) + " (the head dims "
                 "each takes), with and without the mask.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
