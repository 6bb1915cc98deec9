"""Problem shapes: the mission shape, the correctness cases and the sweeps, named once."""
from __future__ import annotations

from typing import NamedTuple


class Shape(NamedTuple):
    """q, k, v and o are [B, H, L, D]."""

    B: int
    H: int
    L: int
    D: int

    @property
    def heads(self) -> int:
        return self.B * self.H

    def label(self) -> str:
        return f"({self.B}, {self.H}, {self.L}, {self.D})"

    def flops(self, causal: bool) -> float:
        """4*B*H*L^2*D: two matmuls of 2*L*L*D each; causal does half the work."""
        full = 4.0 * self.B * self.H * self.L * self.L * self.D
        return full / 2 if causal else full

    def io_bytes(self, elem_bytes: int = 2) -> int:
        """The least DRAM traffic: read q, k, v once and write o once."""
        return 4 * self.B * self.H * self.L * self.D * elem_bytes


MISSION = Shape(1, 8, 512, 64)

# The brief's correctness cases: the mission shape, L that is no tile multiple, a large shape,
# D = 128. Each runs causal and not, over several seeds.
CHECK_SHAPES: tuple[Shape, ...] = (
    MISSION,
    Shape(1, 2, 1, 64),
    Shape(1, 2, 17, 64),
    Shape(2, 3, 333, 64),
    Shape(1, 2, 1000, 64),
    Shape(1, 8, 512, 128),
    Shape(1, 2, 333, 128),
    Shape(2, 8, 2048, 64),
)
CHECK_SEEDS: tuple[int, ...] = (0, 1, 2)

# Extra head dims for kernels that accept any D <= 128 (chapters 1-3).
ODD_HEAD_DIM_SHAPES: tuple[Shape, ...] = (Shape(1, 2, 77, 40), Shape(1, 1, 65, 1), Shape(1, 2, 129, 96))

# Timed shapes: the mission shape and a sequence-length sweep at the mission's B, H, D.
BENCH_SHAPES: tuple[Shape, ...] = (MISSION,)
SWEEP_LENGTHS: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096)
QUICK_SWEEP_LENGTHS: tuple[int, ...] = (256, 512, 1024)


# Chapter 7's target shapes: the mission shape and two long sequences at both head dims.
CH07_TARGET_SHAPES: tuple[Shape, ...] = (MISSION, Shape(4, 16, 4096, 64), Shape(2, 16, 4096, 128))

# A crash probe (attnlab.session.stages's bench stage): each kernel once per mask at a full tile shape and
# at a tail at the other head dim, before one process times them all.
PROBE_SHAPES: tuple[Shape, ...] = (MISSION, Shape(1, 2, 333, 128))

# compute-sanitizer's shapes (attnlab.gpu.sanitize): a tile tail (L = 77) and a head dim the wide
# kernels take, both masks; small, because the sanitizer slows kernels by 10-100x.
SANITIZE_SHAPES: tuple[Shape, ...] = (Shape(1, 2, 77, 64), Shape(1, 1, 130, 128))


def sweep(lengths=SWEEP_LENGTHS, B: int = MISSION.B, H: int = MISSION.H, D: int = MISSION.D):
    return tuple(Shape(B, H, L, D) for L in lengths)
