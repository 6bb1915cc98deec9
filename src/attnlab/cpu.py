"""Your own CUDA kernel on attnlab's CPU executor: no GPU, every memory access checked.

    from attnlab import cpu
    result = cpu.run("vadd.cu", grid=4, block=256, args=(a, b, c, n))   # a, b, c: NumPy arrays
    print(result)              # findings (races, out-of-bounds, ...), bank counts, or "clean"
    result.clean, result.findings, result.banks, result["c"], result.stdout

In a notebook, `%load_ext attnlab.cpu`, then a cell

    %%cuda_cpu vadd --grid 4 --block 256 --args a b c n
    __global__ void vadd(const float* a, const float* b, float* c, int n) { ... }

runs the cell's source with the arrays a, b, c and the number n of the notebook, prints the
summary and keeps the RunResult as `_cuda_cpu`. The command line's twin is
`python -m attnlab run-cpu FILE.cu --grid 4 --block 256 --arg rand:float32:1024 ...`.

A facade over attnlab.executor.reader (and reader_source, reader_commands), imported only when first used: importing this module builds
and loads nothing.
"""
from __future__ import annotations

__all__ = ["load_ipython_extension", "run"]  # and, imported when first named: RunResult, ReaderError


def run(source_or_path, entry=None, grid=(1,), block=(32,), args=(), shared_bytes=0, *, seed=0, races=True,
        banks=True, time_limit=60, name=None):
    """Build (once; cached by content) and run a kernel of your own on the CPU executor.

    source_or_path: a path to a .cu file, or CUDA source text (named `name`, default "cell.cu", in
        findings). entry: the __global__ function to run (needed when the file has several).
    grid, block: an int or a tuple of up to 3 ints. shared_bytes: dynamic shared memory.
    args: one per kernel parameter, checked before the launch: NumPy arrays or contiguous CPU torch
        tensors for pointers (copied into the executor's buffers and back into the same objects
        after the launch, except through pointer-to-const parameters), Python numbers for scalars
        (converted to the parameter's type, range-checked).
    seed: the fibers' schedule (another seed, another interleaving); races, banks: the race check
        and the shared-memory bank counts; time_limit: seconds before the launch is stopped.
    Returns a RunResult; raises ReaderError (a ValueError) when the kernel cannot run as asked."""
    from .executor.reader import run as _run

    return _run(source_or_path, entry, grid, block, args, shared_bytes, seed=seed, races=races, banks=banks,
                time_limit=time_limit, name=name)


def __getattr__(name):
    if name == "RunResult":
        from .executor.reader import RunResult

        return RunResult
    if name in ("ReaderError", "ReaderBuildError"):
        from .executor import reader_source

        return getattr(reader_source, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cuda_cpu_magic(line: str, cell: str, namespace: dict):
    """The %%cuda_cpu cell magic's work, given the user's namespace (see the module's docstring).
    A ReaderError is shown as IPython's one-line UsageError, without a traceback."""
    from .executor.reader_commands import run_cell
    from .executor.reader_source import ReaderError

    try:
        run_cell(line, cell, namespace)
    except ReaderError as exc:
        try:
            from IPython.core.error import UsageError
        except ImportError:  # not in IPython: the error as it is
            raise exc from None
        raise UsageError(str(exc)) from None


def load_ipython_extension(ip) -> None:
    """`%load_ext attnlab.cpu`: registers the %%cuda_cpu cell magic."""
    def cuda_cpu(line, cell):
        """%%cuda_cpu [ENTRY] --grid X[,Y[,Z]] --block X[,Y[,Z]] --args NAME ... [--shared N] [--seed N]
        [--name FILE.cu]: run the cell's CUDA source on attnlab's CPU executor; the RunResult is
        kept as `_cuda_cpu`."""
        cuda_cpu_magic(line, cell, ip.user_ns)

    ip.register_magic_function(cuda_cpu, magic_kind="cell", magic_name="cuda_cpu")
