#!/usr/bin/env python3
"""How long the CPU executor takes to run each kernel once: wall time of one launch (the library
already built) at (1, 2, 129, 64) and (1, 8, 512, 64), causal and not, with and without the race
check. This times the executor on this machine's CPU, never a kernel on a GPU. The table is dated
and names the CPU it ran on, like any measurement; run it on otherwise idle cores.

    python tools/bench_cpu_executor.py                   # every registered kernel: print the table
    python tools/bench_cpu_executor.py --write README.md # also replace the table between its markers
    python tools/bench_cpu_executor.py 07_mma 02_block_tiling   # a few kernels, printed only

--write always times every registered kernel, so the table it leaves lists each one.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnlab.kernels import registry  # noqa: E402
from attnlab.pass_rule import make_inputs  # noqa: E402
from attnlab.executor.cpu import attention_cpu, library_for  # noqa: E402
from attnlab.shapes import Shape  # noqa: E402

SHAPES = (Shape(1, 2, 129, 64), Shape(1, 8, 512, 64))
START, END = "<!-- cpu-executor-bench:start -->", "<!-- cpu-executor-bench:end -->"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_launch(spec, shape: Shape, causal: bool, races: bool) -> tuple[float, bool]:
    """Seconds for one launch, and whether it ran clean (a timing of a failing run is not shown)."""
    q, k, v = make_inputs(shape, 0, device="cpu")
    start = time.perf_counter()
    _, report = attention_cpu(spec, q, k, v, causal, races=races)
    return time.perf_counter() - start, report.clean


def table(kernel_ids) -> str:
    head = ["kernel", "(B, H, L, D)"] + [f"{m}, {r}" for m in ("full", "causal")
                                         for r in ("race check", "no race check")]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    load = os.getloadavg()[0]  # other work on the cores slows every launch: said with the table
    total = 0.0
    for kid in kernel_ids:
        spec = registry.get(kid)
        library_for(spec)  # build first: the table times launches, not g++
        for shape in SHAPES:
            cells = []
            for causal in (False, True):
                for races in (True, False):
                    seconds, clean = time_launch(spec, shape, causal, races)
                    total += seconds
                    cells.append(f"{seconds:.2f}" if clean else "fails")
                    print(f"{kid} {tuple(shape)} causal={causal} races={races}: {cells[-1]}", file=sys.stderr)
            lines.append(f"| `{kid}` | {tuple(shape)} | " + " | ".join(cells) + " |")
    stamp = datetime.date.today().isoformat()
    lines.append("")
    lines.append(f"Seconds per launch, measured on {stamp} on {cpu_name()} ({os.cpu_count()} cores, one used "
                 f"per launch; load average {load:.1f} at the start) by `tools/bench_cpu_executor.py`; "
                 f"{total:.0f} s in all.")
    return "\n".join(lines)


def write_into(path: Path, text: str) -> None:
    doc = path.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        sys.exit(f"{path}: no {START} ... {END} markers to replace")
    path.write_text(pattern.sub(lambda _: f"{START}\n{text}\n{END}", doc))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernels", nargs="*", help="kernel ids (default: every registered kernel)")
    p.add_argument("--write", type=Path, help="a Markdown file whose marked table to replace")
    args = p.parse_args()
    if args.write and args.kernels:
        p.error("--write replaces the whole table: it times every registered kernel, so name none")
    import torch

    torch.set_num_threads(1)
    ids = args.kernels or [s.id for s in registry.select(None)]
    text = table(ids)
    print(text)
    if args.write:
        write_into(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
