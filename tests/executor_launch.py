"""One launch of a self-test kernel with NumPy arrays, shared by the executor's self-tests
(tests/test_executor_faults.py, test_executor_general.py, test_executor_warps.py)."""
from __future__ import annotations

import ctypes

import numpy as np


def launch_arrays(lib, entry, grid, block, args, smem=0, seed=0, names=None, **options):
    """Launch `entry`: NumPy arrays are copied into executor buffers (named `names[i]`, else
    a<i>, with their element size and shape, so findings name their elements) and back into the
    same arrays after the launch; ints and floats pass as they are. The buffers are freed."""
    ptrs, arrays = [], []
    try:
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                p = lib.alloc(a.nbytes, (names or {}).get(i, f"a{i}"), a.itemsize, a.shape)
                ctypes.memmove(p, a.ctypes.data, a.nbytes)
                ptrs.append(p)
                arrays.append((p, a))
            else:
                ptrs.append(a)
        report = lib.launch(entry, grid, block, smem, ptrs, seed=seed, **options)
        for p, a in arrays:
            ctypes.memmove(a.ctypes.data, p, a.nbytes)
    finally:
        lib.free_all()
    return report


def kinds(report) -> set[str]:
    return {f.kind for f in report.findings}
