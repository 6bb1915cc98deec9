"""Each chapter's kernels as the registry holds them: one module per chapter, its launch geometry
beside its entries, its tile sizes read from the kernel's source (attnlab.kernels.source_constants)
so that no number is written twice. Importing any of them registers them all, in chapter order."""
from . import (ch01_scalar, ch02_block_tiling, ch03_warp_reductions, ch04_cublas_hybrid,  # noqa: F401
               ch05_wmma, ch06_warp_specialized, ch07_mma)
