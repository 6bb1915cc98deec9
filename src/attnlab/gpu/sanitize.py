"""compute-sanitizer (memcheck, racecheck, synccheck) over each kernel at small shapes.

memcheck runs with torch's caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1). The sanitizer
wraps a child process that launches one kernel a few times
(`python -m attnlab sanitize --child KERNEL`); its report is parsed for the error summary.
Small shapes keep the run short: the sanitizer slows kernels by 10-100x.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from ..shapes import SANITIZE_SHAPES

TOOLS = ("memcheck", "racecheck", "synccheck")
_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error", re.IGNORECASE)
_HAZARD = re.compile(r"RACECHECK SUMMARY: (\d+) hazard", re.IGNORECASE)


def run_child(kernel_id: str) -> int:
    """Launch the kernel on every sanitize shape it supports, causal and not."""
    from .launch import exercise

    exercise(kernel_id, SANITIZE_SHAPES)
    return 0


def sanitize(kernel_id: str, tool: str, timeout: int = 900) -> dict:
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        raise FileNotFoundError("compute-sanitizer is not on PATH (it ships with the CUDA toolkit)")
    cmd = [exe, f"--tool={tool}", "--target-processes=all", sys.executable, "-m", "attnlab", "sanitize",
           "--child", kernel_id]
    if tool == "racecheck":
        cmd[2:2] = ["--racecheck-report=hazard"]
    env = dict(os.environ)
    if tool == "memcheck":
        # torch's caching allocator hands out pieces of 2 MB segments: a read past a tail row lands
        # inside the segment and memcheck sees nothing. Without the cache each tensor is its own
        # allocation and such a read is out of bounds.
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    text = proc.stdout + proc.stderr
    errors = sum(int(n) for n in _SUMMARY.findall(text)) + sum(int(n) for n in _HAZARD.findall(text))
    found_summary = bool(_SUMMARY.search(text) or _HAZARD.search(text))
    clean = proc.returncode == 0 and errors == 0 and found_summary
    tail = "\n".join(text.strip().splitlines()[-12:])
    return {"kernel": kernel_id, "tool": tool, "clean": clean, "errors": errors,
            "returncode": proc.returncode, "report_tail": tail}
