"""Chapter 4's cost model of its cuBLAS hybrid and of SDPA's math backend on the L4: the bytes each
moves, priced where they live (the L2 while the score tensors fit in it, DRAM beyond), and the time
that predicts. Every number here is a prediction, never a measurement: chapter 4 states and argues
the model, chapter 9 quotes the same functions' numbers.

It lives apart from attnlab.gpu.hybrid, whose source is hashed into the hybrid's records: a change to
the model must not make a measurement stale.

The model, per call, for B*H heads of L x L scores (n = B*H*L*L of them) at head dim D:
- bytes: the passes over the score matrix that each implementation makes (hybrid_bytes,
  math_bytes), plus q, k, v and o once;
- where they live: the L2 when the score tensors alive at once (footprint) fit in the L4's L2, else
  DRAM; a step, so near the boundary the truth lies between the two prices;
- time: the bytes over that level's bandwidth, or the 4 n D FLOPs of the two products over the peak
  of the pipe that runs them, whichever is longer. Launches and other fixed costs are left out, so
  at short L every implementation takes longer than predicted, by about the same few microseconds.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..gpus import by_key
from ..shapes import Shape

L4 = by_key("L4")
SCORE_BYTES = 2                  # the hybrid's S, and P written over it, are fp16 (attnlab.gpu.hybrid)

# The L4's own figures (NVIDIA L4 datasheet): 48 MB of L2, 24 GB of GDDR6 at 300 GB/s (gpus.L4),
# 30.3 TFLOP/s fp32 on CUDA cores, 120 TFLOP/s TF32 on tensor cores with sparsity (60 dense).
L4_L2_BYTES = 48 * 2**20
L4_MEMORY_BYTES = 24 * 10**9
L4_FP32_TFLOPS = 30.3
L4_TF32_TFLOPS = 60.0

# The L4's L2 bandwidth: NVIDIA publishes none, and attnlab has no L4 measurement of it. The
# estimate scales the nearest measurement, an L40's (the same Ada architecture, AD102 where the L4
# is AD104): te42kyfo/gpu-benches, gpu-l2-cache/l40.txt (github.com/te42kyfo/gpu-benches), about
# 5.2 TB/s for every data set up to 92 MB, falling to the 0.85 TB/s of its DRAM beyond its 96 MB
# L2. Two scalings to the L4 bracket it: by SMs x boost clock (L40: 142 SMs, 2490 MHz, NVIDIA L40
# datasheet; L4: 58 SMs, 2040 MHz, TechPowerUp's GPU database), and by L2 slices, which follow the
# memory bus (192 bits against 384), x boost clock. The model takes the lower: an estimate, and
# every time priced with it a prediction.
L40_L2_GBPS_MEASURED = 5200.0
L40_SMS, L40_BOOST_MHZ, L40_BUS_BITS = 142, 2490, 384
L4_BOOST_MHZ, L4_BUS_BITS = 2040, 192
L4_L2_GBPS_BY_SMS = L40_L2_GBPS_MEASURED * (L4.sms * L4_BOOST_MHZ) / (L40_SMS * L40_BOOST_MHZ)
L4_L2_GBPS_BY_BUS = L40_L2_GBPS_MEASURED * (L4_BUS_BITS * L4_BOOST_MHZ) / (L40_BUS_BITS * L40_BOOST_MHZ)
L4_L2_GBPS = min(L4_L2_GBPS_BY_SMS, L4_L2_GBPS_BY_BUS)


def scores(shape: Shape) -> int:
    """n: the B*H*L*L scores."""
    return shape.heads * shape.L * shape.L


def hybrid_bytes(shape: Shape, causal: bool = False) -> int:
    """The hybrid's bytes: GEMM 1 writes S, the softmax reads it twice (the visible half when
    causal) and writes P over it, GEMM 2 reads P: 5 passes over fp16 S, 4 with the mask; plus q, k,
    v and o once."""
    return (4 if causal else 5) * SCORE_BYTES * scores(shape) + shape.io_bytes()


def math_bytes(shape: Shape, fp16_reduction: bool, causal: bool = False) -> int:
    """SDPA's math backend, at least: GEMM 1 writes S, the softmax reads it and writes P, GEMM 2
    reads P; the mask adds one read and one write; in fp32 (fp16_reduction False), the attention
    weights it returns are converted back to fp16 (4 bytes read, 2 written per score). Plus q, k,
    v and o once."""
    n = scores(shape)
    e = 2 if fp16_reduction else 4
    return 4 * n * e + (2 * n * e if causal else 0) + (0 if fp16_reduction else 6 * n) + shape.io_bytes()


def hybrid_footprint(shape: Shape) -> int:
    """Score bytes alive at once in the hybrid: one fp16 S, since P is written over it."""
    return SCORE_BYTES * scores(shape)


def math_footprint(shape: Shape, fp16_reduction: bool) -> int:
    """Score bytes alive at once in the math backend: its softmax is out of place, so S and P."""
    return 2 * (2 if fp16_reduction else 4) * scores(shape)


@dataclass(frozen=True)
class Priced:
    """One implementation's predicted time for one call: a prediction, not a measurement."""
    bytes: int
    footprint: int          # score bytes alive at once
    level: str              # where the bytes live: "L2" or "DRAM"
    gbps: float             # that level's bandwidth
    flops: float            # the two products (cuBLAS computes all of S, mask or not)
    tflops: float           # the peak of the pipe that runs them
    pipe: str

    @property
    def memory_us(self) -> float:
        return self.bytes / (self.gbps * 1e9) * 1e6

    @property
    def compute_us(self) -> float:
        return self.flops / (self.tflops * 1e12) * 1e6

    @property
    def us(self) -> float:
        return max(self.memory_us, self.compute_us)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_us >= self.compute_us else "compute"


# Where the bytes live -> that level's bandwidth on the L4, GB/s.
BANDWIDTH_GBPS = {"L2": L4_L2_GBPS, "DRAM": L4.dram_gbps}


def level(footprint: int) -> tuple[str, float]:
    """(where, GB/s): the L4's L2 while `footprint` bytes fit in it, its DRAM otherwise."""
    where = "L2" if footprint <= L4_L2_BYTES else "DRAM"
    return where, BANDWIDTH_GBPS[where]


def predict_hybrid(shape: Shape, causal: bool = False) -> Priced:
    """The hybrid on the L4: its bytes where its S lives, its GEMMs on fp16 tensor cores."""
    where, gbps = level(hybrid_footprint(shape))
    return Priced(hybrid_bytes(shape, causal), hybrid_footprint(shape), where, gbps, shape.flops(False),
                  L4.fp16_tflops, "fp16 tensor cores")


def predict_math(shape: Shape, fp16_reduction: bool, tf32: bool, causal: bool = False) -> Priced:
    """SDPA's math backend on the L4, as PyTorch configures it: fp16 scores and tensor-core products
    with fp16_reduction; fp32 scores otherwise, with products in TF32 where allowed, else on CUDA
    cores."""
    where, gbps = level(math_footprint(shape, fp16_reduction))
    if fp16_reduction:
        tflops, pipe = L4.fp16_tflops, "fp16 tensor cores"
    elif tf32:
        tflops, pipe = L4_TF32_TFLOPS, "TF32 tensor cores"
    else:
        tflops, pipe = L4_FP32_TFLOPS, "fp32 CUDA cores"
    return Priced(math_bytes(shape, fp16_reduction, causal), math_footprint(shape, fp16_reduction), where,
                  gbps, shape.flops(False), tflops, pipe)


def price_at(p: Priced, where: str) -> float:
    """`p`'s predicted time had its bytes lived in `where` ("L2" or "DRAM") instead."""
    return max(p.bytes / (BANDWIDTH_GBPS[where] * 1e9) * 1e6, p.compute_us)


def hybrid_over_math(shape: Shape, fp16_reduction: bool, tf32: bool, causal: bool = False) -> float:
    """The predicted time of the hybrid over that of SDPA's math backend (below 1: the hybrid is
    faster), as chapter 4's model gives it."""
    return predict_hybrid(shape, causal).us / predict_math(shape, fp16_reduction, tf32, causal).us


def math_backend_config() -> tuple[bool, bool]:
    """(fp16_reduction, tf32) of SDPA's math backend in this PyTorch: whether it may keep fp16
    scores (torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(); a PyTorch without that
    switch computes the math backend in the inputs' dtype), and whether fp32 matmuls may use TF32."""
    import torch

    allowed = getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", None)
    return (True if allowed is None else bool(allowed())), bool(torch.backends.cuda.matmul.allow_tf32)
