"""Datasheet ceilings of the GPUs readers use, and the floor they put under an attention shape.

Peak is dense fp16 tensor-core math with fp32 accumulation (what every attnlab kernel does),
without sparsity. Measured ceilings (a cuBLAS matmul and a device copy timed in the same run)
live in the bench records; these datasheet numbers are the other yardstick.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .shapes import Shape


@dataclass(frozen=True)
class GpuSpec:
    key: str
    pattern: str            # regex matched against torch.cuda.get_device_name()
    arch: str               # sm_XY
    sms: int
    fp16_tflops: float      # dense, fp32 accumulate
    dram_gbps: float
    smem_per_block_kb: int  # after opt-in

    @property
    def ridge_flop_per_byte(self) -> float:
        return self.fp16_tflops * 1e12 / (self.dram_gbps * 1e9)


# Most specific patterns first: "L40S" and "L40" must not be read as "L4".
GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("L40S", r"\bL40S\b", "sm_89", 142, 362.0, 864.0, 99),
    GpuSpec("L4", r"\bL4\b", "sm_89", 58, 121.0, 300.0, 99),
    GpuSpec("RTX 4090", r"RTX 4090", "sm_89", 128, 165.2, 1008.0, 99),
    GpuSpec("A10", r"\bA10\b", "sm_86", 72, 125.0, 600.0, 99),
    GpuSpec("RTX 3090", r"RTX 3090", "sm_86", 82, 71.0, 936.0, 99),
    GpuSpec("A100 40GB", r"A100.*(40GB|PCIE-40GB|SXM4-40GB)", "sm_80", 108, 312.0, 1555.0, 163),
    GpuSpec("A100 80GB", r"A100", "sm_80", 108, 312.0, 2039.0, 163),
    GpuSpec("H100 PCIe", r"H100.*PCIe", "sm_90", 114, 756.0, 2000.0, 227),
    GpuSpec("H100 NVL", r"H100 NVL", "sm_90", 132, 835.0, 3900.0, 227),
    GpuSpec("H100 SXM", r"H100", "sm_90", 132, 989.0, 3350.0, 227),
    GpuSpec("H200", r"H200", "sm_90", 132, 989.0, 4800.0, 227),
)

REFERENCE_GPU = "L4"  # the owner's card: the book's default yardstick


def by_key(key: str) -> GpuSpec:
    for g in GPUS:
        if g.key == key:
            return g
    raise KeyError(f"no GPU {key!r} in the table; known: {', '.join(g.key for g in GPUS)}")


def lookup(device_name: str) -> GpuSpec | None:
    """The table entry for a CUDA device name, or None for a GPU the table does not know."""
    for g in GPUS:
        if re.search(g.pattern, device_name, flags=re.IGNORECASE):
            return g
    return None


# The L4's ceiling: 99 KB of shared memory per block after opt-in (48 KB without).
L4_MAX_SMEM_PER_BLOCK = 99 * 1024


def _of_gpu_at_hand(read, from_table, l4_value):
    """(value, whose) of one property of the GPU at hand: read(props) from torch's device
    properties, or where that gives nothing (a torch or a stand-in without the field)
    from_table(GpuSpec) of the datasheet table for its name, else the L4's; the L4's `l4_value`,
    the reader's card, where torch sees no GPU."""
    from .env import has_gpu

    if not has_gpu():
        return l4_value, "the L4's"
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    value = read(props)
    if not value:
        known = lookup(props.name)
        value = from_table(known) if known else l4_value
    return value, f"the {props.name}'s"


def max_smem_per_block(arch: str | None = None) -> tuple[int, str]:
    """(bytes, whose) of shared memory one block may opt in to: architecture `arch`'s when it is
    given (SM_LIMITS), else the current GPU's where torch sees one (227 KB on an H100), and the L4's
    99 KB, the reader's card, without one."""
    if arch is not None and arch in SM_LIMITS:
        return SM_LIMITS[arch].smem_per_block, ("the L4's" if arch == by_key(REFERENCE_GPU).arch else f"an {arch} GPU's")
    limit, whose = _of_gpu_at_hand(lambda p: getattr(p, "shared_memory_per_block_optin", 0),
                                   lambda known: known.smem_per_block_kb * 1024, L4_MAX_SMEM_PER_BLOCK)
    return int(limit), whose


def arch_at_hand() -> tuple[str, str]:
    """(sm_XY, whose) of the GPU at hand, where torch sees one, and the L4's sm_89 without one: the
    architecture whose tiles chapter 7's kernels take (registry.KernelSpec.for_arch)."""
    def read(props):
        major, minor = getattr(props, "major", None), getattr(props, "minor", None)
        return None if major is None else f"sm_{major}{minor}"

    return _of_gpu_at_hand(read, lambda known: known.arch, by_key(REFERENCE_GPU).arch)


def sm_count() -> tuple[int, str]:
    """(SMs, whose) of the GPU at hand, where torch sees one, and the L4's 58 without one: what
    chapter 7's launcher sizes its grid for (registry.choose_kv_split)."""
    sms, whose = _of_gpu_at_hand(lambda p: getattr(p, "multi_processor_count", 0), lambda known: known.sms,
                                 by_key(REFERENCE_GPU).sms)
    return int(sms), whose


@dataclass(frozen=True)
class Floor:
    compute_us: float
    memory_us: float

    @property
    def us(self) -> float:
        return max(self.compute_us, self.memory_us)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_us >= self.memory_us else "memory"


def floor(shape: Shape, gpu: GpuSpec, causal: bool = False) -> Floor:
    """The least time: FLOPs over peak, or the unavoidable bytes over bandwidth, whichever is more."""
    return Floor(compute_us=shape.flops(causal) / (gpu.fp16_tflops * 1e12) * 1e6,
                 memory_us=shape.io_bytes() / (gpu.dram_gbps * 1e9) * 1e6)


def arithmetic_intensity(shape: Shape, causal: bool = False) -> float:
    return shape.flops(causal) / shape.io_bytes()


def tflops(shape: Shape, causal: bool, time_us: float) -> float:
    return shape.flops(causal) / (time_us * 1e-6) / 1e12


# --- occupancy -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SmLimits:
    """What one SM holds (CUDA C++ Programming Guide, compute-capabilities table)."""
    arch: str
    registers: int = 65536
    max_threads: int = 2048
    max_blocks: int = 32
    smem: int = 167936            # shared memory per SM usable by blocks (the largest carve-out)
    smem_per_block: int = 166912  # what one block may opt in to (cudaFuncAttributeMaxDynamicSharedMemorySize)
    reserved_smem: int = 1024     # the runtime's share of each block (sm_80 and later)
    register_unit: int = 256      # registers are allocated per warp in units of 256
    smem_unit: int = 128          # shared memory is allocated per block in units of 128 bytes


SM_LIMITS = {
    "sm_80": SmLimits("sm_80", max_threads=2048, max_blocks=32, smem=167936, smem_per_block=166912),
    "sm_86": SmLimits("sm_86", max_threads=1536, max_blocks=16, smem=102400, smem_per_block=101376),
    "sm_89": SmLimits("sm_89", max_threads=1536, max_blocks=24, smem=102400, smem_per_block=101376),
    "sm_90": SmLimits("sm_90", max_threads=2048, max_blocks=32, smem=233472, smem_per_block=232448),
}


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    max_warps: int
    limiters: tuple[str, ...]     # every limit that allows no more blocks, most basic first

    @property
    def limiter(self) -> str:
        """"threads", "registers", "shared memory" or "blocks": the first of the limiters."""
        return self.limiters[0]

    @property
    def fraction(self) -> float:
        return self.warps_per_sm / self.max_warps


def occupancy(arch: str, threads: int, registers: int, smem_bytes: int) -> Occupancy:
    """Theoretical occupancy, by the occupancy calculator's rules: resident blocks per SM are the
    fewest that threads, registers (allocated per warp, 256 at a time), shared memory (plus the
    runtime's 1 KB per block, allocated 128 bytes at a time) and the block limit allow."""
    lim = SM_LIMITS[arch]
    warps = -(-threads // 32)
    regs_per_warp = -(-registers * 32 // lim.register_unit) * lim.register_unit
    smem_per_block = -(-(smem_bytes + lim.reserved_smem) // lim.smem_unit) * lim.smem_unit
    limits = {
        "threads": lim.max_threads // (warps * 32),
        "registers": lim.registers // (regs_per_warp * warps) if registers else lim.max_blocks,
        "shared memory": lim.smem // smem_per_block,
        "blocks": lim.max_blocks,
    }
    blocks = min(limits.values())
    return Occupancy(blocks, blocks * warps, lim.max_threads // 32,
                     tuple(k for k, v in limits.items() if v == blocks))
