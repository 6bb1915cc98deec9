"""The one table of kernels. The book, the tests, the command line and the plots all read it.

Each entry names its source file and entry point, its launch geometry as functions of the
problem shape, and its limits. Launch geometry is what the launcher uses, the static inspection
checks and the book prints: there is no second copy of it anywhere. Each chapter registers its
kernels from its own module (attnlab.kernels.chapters), beside their geometry, and takes its tile
sizes from the kernel's source (attnlab.kernels.source_constants): no number is written twice.
What a spec is, and how a registered kernel is built for a GPU, is attnlab.kernels.spec.
"""
from __future__ import annotations

from ..gpus import L4_MAX_SMEM_PER_BLOCK  # noqa: F401 (read from here)
from .chapters import (ch01_scalar, ch02_block_tiling, ch03_warp_reductions,  # noqa: F401
                       ch04_cublas_hybrid, ch05_wmma, ch06_warp_specialized, ch07_mma)
from .chapters.ch07_mma import (COMBINE_THREADS, PARTS_07, SPLIT_EFFICIENCY, SPLIT_FILL, STEPS_07,  # noqa: F401
                                Step, choose_kv_split, cta_split_candidates)
from .spec import (DEFAULT_SMEM_LIMIT, KERNELS, KernelSpec, Knob, Tuning, by_label, cdiv, get,  # noqa: F401
                   register, select)
