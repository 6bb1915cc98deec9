"""The one table of kernels. The book, the tests, the command line and the plots all read it.

Each entry names its source file and entry point, its launch geometry as functions of the
problem shape, and its limits. Launch geometry is what the launcher uses, the static inspection
checks and the book prints: there is no second copy of it anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .paths import kernels_dir
from .shapes import Shape

# The L4's ceiling: 99 KB of shared memory per block after opt-in (48 KB without).
L4_MAX_SMEM_PER_BLOCK = 99 * 1024
DEFAULT_SMEM_LIMIT = 48 * 1024


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KernelSpec:
    id: str
    chapter: int
    title: str
    source: str                                # file under kernels/
    entry: str                                 # extern "C" entry point
    block: Callable[[Shape], tuple[int, int, int]]
    grid: Callable[[Shape], tuple[int, int, int]]
    dynamic_smem: Callable[[Shape], int] = lambda s: 0
    head_dims: frozenset[int] | None = None    # None: any D in 1..max_head_dim
    max_head_dim: int = 128
    causal: bool = True
    max_len: int | None = None                 # None: any L >= 1
    summary: str = ""
    extra_sources: tuple[str, ...] = field(default=("common.cuh",))

    @property
    def path(self):
        return kernels_dir() / self.source

    def supports_head_dim(self, D: int) -> bool:
        if self.head_dims is not None:
            return D in self.head_dims
        return 1 <= D <= self.max_head_dim

    def head_dim_text(self) -> str:
        if self.head_dims is not None:
            return ", ".join(str(d) for d in sorted(self.head_dims))
        return f"1..{self.max_head_dim}"

    def launch_config(self, shape: Shape) -> dict:
        return {"grid": self.grid(shape), "block": self.block(shape),
                "dynamic_smem": self.dynamic_smem(shape)}


_SCALAR_THREADS = 128  # must match THREADS in kernels/01_scalar.cu (checked by the tests)

KERNELS: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    if spec.id in KERNELS:
        raise ValueError(f"kernel id {spec.id!r} registered twice")
    KERNELS[spec.id] = spec
    return spec


register(KernelSpec(
    id="01_scalar",
    chapter=1,
    title="Scalar baseline",
    source="01_scalar.cu",
    entry="attn_fwd_01_scalar",
    block=lambda s: (_SCALAR_THREADS, 1, 1),
    grid=lambda s: (_cdiv(s.L, _SCALAR_THREADS), s.B * s.H, 1),
    summary="one thread per query row, fp32 online softmax on CUDA cores",
))


def get(kernel_id: str) -> KernelSpec:
    try:
        return KERNELS[kernel_id]
    except KeyError:
        known = ", ".join(KERNELS)
        raise KeyError(f"unknown kernel {kernel_id!r}; registered: {known}") from None


def select(ids: list[str] | None) -> list[KernelSpec]:
    """The kernels named on a command line, or all of them in chapter order."""
    if not ids:
        return sorted(KERNELS.values(), key=lambda s: (s.chapter, s.id))
    return [get(i) for i in ids]
