"""The mutation check: each plausible mistake of attnlab.executor.mutants, applied to a scratch copy of
kernels/, must make the CPU suite fail (a wrong output, a finding, or a broken bank promise).

Each mutant runs in its own process, bounded by a timeout: a mutant may deadlock, loop or crash
the executor, and none of that may stop the others. A mutant's cases stop at the first failure
(it is killed); a survivor has run its whole suite. A mutant whose text is missing, or that the
compiler rejects, is an error in the list, not a kill.

    python -m attnlab mutate              # every mutant; exit 1 on a survivor or a broken mutant
    python -m attnlab mutate 07-wait-depth swizzle-period
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from ..kernels import registry
from ..kernels.sources import source_files
from ..paths import kernels_dir
from .cpu import CPU_SCHEDULE_SEEDS, cpu_shapes
from .mutants import MUTANTS, Mutant

# Per mutant, all its cases together (a survivor runs them all; a hang is bounded per launch too).
MUTANT_TIMEOUT_S = 600
LAUNCH_TIME_LIMIT_S = 60.0
# Shapes that catch the most first: several heads and query blocks, then tile edges, then the rest.
_LENGTH_ORDER = (130, 129, 65, 17, 200, 1, 2, 15, 63, 127)


@dataclass
class Outcome:
    mutant: str
    status: str          # "killed", "survived", "timeout", "crashed" (a signal during a launch);
                         # "invalid" (the list is wrong), "error" (the check itself failed)
    cases_run: int = 0
    by: str = ""         # the case and reason that killed it, or what went wrong
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Caught: a failing case, or a hang or crash (which a GPU run would show as well)."""
        return self.status in ("killed", "timeout", "crashed")


def get(mutant_id: str) -> Mutant:
    for m in MUTANTS:
        if m.id == mutant_id:
            return m
    raise KeyError(f"no mutant {mutant_id!r}; known: {', '.join(m.id for m in MUTANTS)}")


def problems(mutant: Mutant, src_dir: Path | None = None) -> list[str]:
    """What is wrong with a mutant as written (empty: it applies to kernels/ as it is)."""
    src_dir = Path(src_dir or kernels_dir())
    out = []
    path = src_dir / mutant.file
    if not path.is_file():
        return [f"{mutant.id}: no file kernels/{mutant.file}"]
    count = path.read_text().count(mutant.find)
    if count != 1:
        out.append(f"{mutant.id}: its text occurs {count} times in kernels/{mutant.file}, not once")
    if mutant.find == mutant.replace:
        out.append(f"{mutant.id}: changes nothing")
    for kid in mutant.kernels:
        try:
            spec = registry.by_label(kid)
        except KeyError:
            out.append(f"{mutant.id}: no registered kernel {kid!r}")
            continue
        if mutant.file not in {f.name for f in source_files(spec)}:
            out.append(f"{mutant.id}: {kid} does not use {mutant.file}")
    return out


def apply(mutant: Mutant, dest: Path) -> Path:
    """A copy of kernels/ under `dest` with the mutant's edit made."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for f in kernels_dir().iterdir():
        if f.suffix in (".cu", ".cuh"):
            shutil.copyfile(f, dest / f.name)
    path = dest / mutant.file
    text = path.read_text()
    if text.count(mutant.find) != 1:
        raise ValueError(f"{mutant.id}: its text does not occur exactly once in {mutant.file}")
    path.write_text(text.replace(mutant.find, mutant.replace))
    return dest


def cases(mutant: Mutant) -> list[tuple[str, object, bool, int]]:
    """(kernel id, shape, causal, seed): the CPU suite of the mutant's kernels, likeliest killers first."""
    order = {L: i for i, L in enumerate(_LENGTH_ORDER)}
    out = []
    for seed in CPU_SCHEDULE_SEEDS:
        for kid in mutant.kernels:
            spec = registry.by_label(kid)
            shapes = sorted(cpu_shapes(spec), key=lambda s: (order.get(s.L, len(order)), s.D))
            out += [(kid, shape, causal, seed) for shape in shapes
                    for causal in ((True, False) if spec.causal else (False,))]
    return out


def run_in_process(mutant: Mutant, max_cases: int | None = None) -> Outcome:
    """Apply the mutant to a scratch copy and run its cases here until one fails (at most
    `max_cases` of them: the runner's own tests)."""
    from .build import ExecutorBuildError
    from .cpu import check_case_cpu

    bad = problems(mutant)
    if bad:
        return Outcome(mutant.id, "invalid", by="; ".join(bad))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"attnlab-mutant-{mutant.id}-") as tmp:
        src = apply(mutant, Path(tmp) / "kernels")
        n = 0
        for n, (kid, shape, causal, seed) in enumerate(cases(mutant)[:max_cases], 1):
            print(f"case {n}", flush=True)  # run_isolated: a signal after this is the kernel's doing
            try:
                case = check_case_cpu(registry.by_label(kid), shape, causal, seed, src_dir=src,
                                      time_limit=LAUNCH_TIME_LIMIT_S)
            except ExecutorBuildError as exc:
                return Outcome(mutant.id, "invalid", n, f"does not compile: {str(exc).splitlines()[-1][:200]}",
                               time.monotonic() - start)
            if not case.passed:
                first = case.findings[0] if case.findings else ""
                by = f"{kid} {tuple(shape)} causal={causal} seed={seed}: {case.reason}" + (f" | {first}" if first else "")
                return Outcome(mutant.id, "killed", n, by, time.monotonic() - start)
        return Outcome(mutant.id, "survived", n, "every case passed", time.monotonic() - start)


def run_isolated(mutant: Mutant, timeout: float = MUTANT_TIMEOUT_S) -> Outcome:
    """run_in_process in a child process, so that a crash or hang is an outcome, not the end."""
    start = time.monotonic()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run([sys.executable, "-m", "attnlab.executor.mutation", mutant.id], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Outcome(mutant.id, "timeout", by=f"no verdict within {timeout:.0f} s", seconds=timeout)
    lines = proc.stdout.strip().splitlines()
    try:
        return Outcome(**json.loads(lines[-1]))
    except (IndexError, json.JSONDecodeError, TypeError):
        pass
    # No verdict. Killed by a signal inside a launch (the executor faulted on the mutant's
    # account), it is caught; any other end (an exception, a crash before the first case) is the
    # check's own failure and must not pass for a kill.
    started = sum(line.startswith("case ") for line in lines)
    tail = (proc.stderr.strip().splitlines() or [""])[-1]
    status = "crashed" if proc.returncode < 0 and started else "error"
    return Outcome(mutant.id, status, started, f"exit status {proc.returncode}: {tail[:200]}",
                   time.monotonic() - start)


def run_all(mutants=MUTANTS, jobs: int | None = None, progress: bool = True) -> list[Outcome]:
    from tqdm.auto import tqdm

    jobs = jobs or max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_isolated, m) for m in mutants]
        return [f.result() for f in tqdm(futures, desc="mutants", unit="mutant", disable=not progress)]


def format_table(outcomes: list[Outcome]) -> str:
    width = max(len(o.mutant) for o in outcomes)
    lines = [f"{'mutant':<{width}}  {'verdict':<9} {'cases':>5} {'s':>6}  caught by"]
    for o in outcomes:
        lines.append(f"{o.mutant:<{width}}  {o.status:<9} {o.cases_run:>5} {o.seconds:>6.1f}  {o.by}")
    bad = [o for o in outcomes if not o.ok]
    lines.append(f"{len(outcomes) - len(bad)}/{len(outcomes)} mutants caught"
                 + (f"; NOT caught: {', '.join(o.mutant for o in bad)}" if bad else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    """The child process of run_isolated: one mutant, its Outcome as the last line of stdout."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m attnlab.executor.mutation MUTANT_ID", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    outcome = run_in_process(get(argv[0]))
    print(json.dumps(asdict(outcome)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
