"""attnlab's CPU executor: the chapters' .cu files compiled with a C++ compiler and run with the
threads of each block as fibers, warp-collective operations and cp.async as the PTX ISA specifies
them, and the checks a sanitizer makes (races, out-of-bounds, uninitialized and early reads,
deadlocks, barrier and mask misuse). It never produces a timing."""
from .build import ExecutorBuildError, ExecutorUnavailable, compiler
from .library import BankCounts, Finding, LaunchReport, Library, load

__all__ = ["BankCounts", "ExecutorBuildError", "ExecutorUnavailable", "Finding", "LaunchReport", "Library",
           "compiler", "load"]
