"""exercises/: the reader's exercises. Each is a small kernel with one gap, a skeleton under the
repository's exercises/ (untouched, it compiles and fails) and its solution; its checker (checkers,
on the building and launching of harness) runs the reader's file on the CPU executor at several
shapes and seeds and passes it only with the right numbers (the pass rule against the fp64
reference, or exact values), zero findings and, where banks are the point, no wavefront past the
ideal. The registry names them and judges a file in one line (`python -m attnlab exercises`).

From Python, a notebook included (workspace; the kernel judged in a child process):

    import attnlab.exercises as ex
    ex.start("ch03-warp-reduce")   # copies the skeleton to my-exercises/ch03-warp-reduce.cu
    ex.check("ch03-warp-reduce")   # judges that copy (or ex.check(ID, path) any file): the verdict

Imports the ground and executor (kernels it may, and needs not): never records, model, gpu,
session or book. `import attnlab.exercises` imports nothing more: check and start load their
modules when called.
"""
from __future__ import annotations

__all__ = ["check", "start"]


def check(exercise_id: str, path=None, timeout: float = 300.0):
    """Judge your file for one exercise on the CPU executor, in a child process (a kernel that
    crashes or hangs cannot take this one with it). `path`: your .cu file, relative to the current
    directory; by default the working copy `start` made (my-exercises/<id>.cu). Returns the
    Verdict, which shows as one line (and the hint when it fails); `.passed` says which."""
    from .workspace import check as _check

    return _check(exercise_id, path, timeout)


def start(exercise_id: str) -> None:
    """Copy the exercise's skeleton to your working copy, my-exercises/<id>.cu at the repository
    root (an existing copy is kept), and print where it is and the line that checks it."""
    from .workspace import start as _start

    _start(exercise_id)
