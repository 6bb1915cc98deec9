"""The book's one time model: a kernel's counted work divided by the rates of a GPU, resource by
resource, the largest bound the prediction.

    p = predict("07_mma", MISSION, causal=False, gpu="L4")
    p.time_us, p.bottleneck, p.bounds            # predicted, never measured

What it takes as given (the page "The time model" states the same):
  - the counts: every CTA of the launch run on the CPU executor (attnlab.executor.trace) with the
    tiles and the launch geometry the launcher picks for that GPU (its SM count, its architecture);
    past RUN_EVERY_CTA CTAs, the CTAs of the first head run and every head counts as it does
    (trace_one_head: the heads run the same code; the prediction's heads_run says so);
  - the rates per SM and clock of each architecture (ARCH_RATES: the CUDA C++ Programming Guide's
    throughput table for fp32 FMA, MUFU exponentials, shuffles; 32 banks of 4 bytes of shared memory;
    dense fp16 tensor-core FLOPs with fp32 accumulation), and the clock that makes the datasheet's
    tensor-core peak (gpus.GPUS) equal SMs x that rate x clock;
  - L2 to SM: 64 bytes per clock per SM, an assumption (no datasheet gives it), over every sector
    the warps' requests touch (no L1 reuse: a bound on L2 traffic, not its measurement);
  - DRAM: the distinct bytes the launch reads and writes, once, at the datasheet bandwidth;
  - CTAs go to SMs in launch order, each to the SM with the least work so far, as many per SM as
    ptxas's registers, the shared memory and the threads allow; an SM's co-resident CTAs share its
    pipes, so each per-SM resource is bounded by the busiest SM (waves and imbalance included);
  - a warp issues a dependent fp32 FMA every FMA_LATENCY cycles, so a scheduler with fewer than
    that many warps runs its FMA pipe at that fraction (the chapters 1-3 kernels are chains of
    dependent FMAs);
  - instruction issue: each of an SM's SCHEDULERS_PER_SM schedulers issues one warp instruction
    per clock; a CTA issues each SASS instruction of its key-tile loop on the trips its source line
    ran on the executor (a guarded copy or mask on fewer), the rest once per warp
    (attnlab.model.issue); not given where the SASS's loops do not say which code runs how often;
  - latency: a warp waits out the stall ptxas wrote into each instruction of the key-tile loop it
    issues (its control code, attnlab.kernels.sass_control: the fixed-latency dependencies the
    compiler did not fill with other work), counted on the same trips, so a CTA takes at least its
    warps' stalls; given where the issue bound is. On sm_90, where the loop is the tensor cores' (it
    holds HMMA) and a CTA's warps fill the schedulers evenly, a scheduler waits out the stalls of the
    warps it holds one after another (STALLS_IN_TURN): an SM's co-resident CTAs hide none of each
    other's. Elsewhere an SM overlaps its CTAs as many at a time as it holds. (The sm_90 records of
    chapter 7's steps at the large shapes, two or three CTAs to an SM, ran closer to the stalls taken
    in turn than to the overlapped bound: model.ipynb quotes the ratios);
  - LAUNCH_US per kernel launch, and for chapter 4 the two cuBLAS GEMMs at the tensor-core peak
    and DRAM (the executor runs only its softmax).
Not modelled: waits on variable-latency results (shared memory, `ex2`, global memory: the
scoreboards), dual issue, L1 hits, clocks below boost, and contention between resources (the bounds
do not add; outside an sm_90 tensor-core loop (in_turn), two warps of a scheduler that each stall
half the time are taken to fill it), and the stalls of the code outside the key-tile loop (its
converged path holds branches not every warp takes; counted on every warp, `outside=True`, the
sm_90 records of chapter 7's steps at the mission shape mostly ran faster than predicted: model.ipynb).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from ..executor.trace import Trace, ideal_counts, one_head_grid, trace, trace_one_head
from . import issue as issue_model
from ..gpus import SM_LIMITS, GpuSpec, by_key, occupancy
from ..kernels import registry
from ..shapes import Shape

# Per SM and clock, by architecture (CUDA C++ Programming Guide, "Arithmetic Instructions"
# throughput table; tensor cores from the datasheets' dense fp16 peak over SMs and boost clock).
ARCH_RATES: dict[str, dict[str, float]] = {
    "sm_80": {"tensor_flops": 2048, "fma": 64, "exp": 16, "shuffle_lanes": 32, "smem_bytes": 128},
    "sm_86": {"tensor_flops": 1024, "fma": 128, "exp": 16, "shuffle_lanes": 32, "smem_bytes": 128},
    "sm_89": {"tensor_flops": 1024, "fma": 128, "exp": 16, "shuffle_lanes": 32, "smem_bytes": 128},
    "sm_90": {"tensor_flops": 4096, "fma": 128, "exp": 16, "shuffle_lanes": 32, "smem_bytes": 128},
}
L2_BYTES_PER_CLOCK_SM = 64   # an assumption: no datasheet gives the L2-to-SM bandwidth
FMA_LATENCY = 4              # cycles between dependent fp32 FMAs of one warp
SCHEDULERS_PER_SM = 4
LAUNCH_US = 3.0              # one kernel launch, as a CUDA-graph replay sees it
PREDICTED_GPUS = ("L4", "H100 SXM")  # what the pages predict for: the reader's card and the lent one
# Launches up to this many CTAs run whole on the executor; larger ones, one head. One head's counts
# equal every head's exactly (tests/test_trace.py), and the large shapes' launches are 1,024 CTAs and
# more: one at (2, 16, 4096, 128) takes about 15 minutes on two cores whole and half a minute by one head.
RUN_EVERY_CTA = 512
# Per architecture, the loops (by the marker attnlab.model.issue finds them by) whose warps wait out
# their stalls one after another on a scheduler: the records, all of sm_90 and of chapter 7's
# four-warp mma.sync loops, chose this rule for its tensor-core loops (model.ipynb, "What the records
# taught the model"); it is taken for every sm_90 HMMA loop whose CTAs' warps fill the schedulers
# evenly (in_turn). A likely reason, which no counter here isolates: an HMMA's stall covers cycles in
# which the scheduler's tensor pipe and the reads of its operands (ten registers a lane) are busy for
# every warp it holds, not only for the one that issued it. Elsewhere, and on the architectures no
# record has tested, the stalls are taken as a warp's own, which the other warps of its scheduler fill.
STALLS_IN_TURN: dict[str, tuple[str, ...]] = {"sm_90": ("HMMA",)}


@dataclass(frozen=True)
class Bound:
    resource: str
    time_us: float  # NaN: not given (work says why)
    work: str       # what was counted and at which rate, in words

    @property
    def given(self) -> bool:
        return math.isfinite(self.time_us)


@dataclass
class Prediction:
    """Predicted, never measured: each resource's bound and the largest, plus the launches."""
    kernel: str
    gpu: str
    shape: Shape
    causal: bool
    bounds: list[Bound]
    launches: int
    ctas: int
    ctas_per_sm: int
    extra: list[Bound] = field(default_factory=list)  # added on top (chapter 4's GEMMs)
    heads_run: int | None = None  # None: every CTA's counts ran; else the heads whose CTAs ran (trace_one_head)

    @property
    def top(self) -> Bound:
        return max((b for b in self.bounds if b.given), key=lambda b: b.time_us)

    @property
    def bottleneck(self) -> str:
        return self.top.resource

    @property
    def time_us(self) -> float:
        return self.top.time_us + sum(b.time_us for b in self.extra) + LAUNCH_US * self.launches

    def without(self, resource: str) -> "Prediction":
        """The same prediction with one resource's bound left out: what the rest of the model
        predicts (a page sets the two side by side where that resource decides)."""
        return dataclasses.replace(self, bounds=[b for b in self.bounds if b.resource != resource])


def clock_ghz(gpu: GpuSpec) -> float:
    """The clock at which SMs x the architecture's tensor rate gives the datasheet's peak."""
    return gpu.fp16_tflops * 1e12 / (gpu.sms * ARCH_RATES[gpu.arch]["tensor_flops"]) / 1e9


def ctas_per_sm(kernel: str, shape: Shape, gpu: GpuSpec) -> int:
    """Resident CTAs per SM of the launch at `shape` on `gpu`: ptxas's registers (nvcc, cached), the
    launch's threads and shared memory, by the occupancy rules (gpus.occupancy)."""
    return launch_occupancy(kernel, shape, gpu).blocks_per_sm


def launch_occupancy(kernel: str, shape: Shape, gpu: GpuSpec, smem_freed: int = 0):
    """gpus.occupancy of the launch at `shape` on `gpu` (what limits it, too); `smem_freed`: with
    that many bytes less dynamic shared memory per CTA, all else the same (a change to weigh)."""
    cfg = registry.get(kernel, gpu.arch).launch_config(shape, gpu.sms)
    return occupancy(gpu.arch, int(np.prod(cfg["block"])), launch_registers(kernel, shape, gpu),
                     cfg["dynamic_smem"] - smem_freed)


def launch_registers(kernel: str, shape: Shape, gpu: GpuSpec) -> int:
    """Registers per thread of the entry the launch at `shape` on `gpu` runs (ptxas, cached; 0 where
    the build does not list it)."""
    from ..kernels.static import inspect_kernel

    spec = registry.get(kernel, gpu.arch)
    entry = spec.launch_config(shape, gpu.sms)["entry"]
    return next((f.registers for f in inspect_kernel(spec, gpu.arch).functions if f.name == entry), 0)


def _schedule(work: np.ndarray, sms: int) -> np.ndarray:
    """Each CTA's SM: CTAs in launch order, each to the SM with the least work so far."""
    import heapq

    heap = [(0.0, sm) for sm in range(sms)]
    owner = np.empty(len(work), np.int64)
    for i, w in enumerate(work):
        load, sm = heapq.heappop(heap)
        owner[i] = sm
        heapq.heappush(heap, (load + float(w), sm))
    return owner


def _cuda_core_rate_and_flops(t: Trace, gpu: GpuSpec, resident: int, dot_products: bool) -> tuple[float, int]:
    """(fp32 FMAs per SM-clock the CTAs can issue, CUDA-core FLOPs of the launch): a scheduler
    with fewer warps than FMA_LATENCY runs its pipe at that fraction; the FLOPs are 4 D per score
    kept where the launch computes the dot products and runs no tensor-core instruction."""
    threads = int(np.prod(t.launches[0].block))
    warps_per_scheduler = _at_once(t, gpu, resident) * math.ceil(threads / 32) / SCHEDULERS_PER_SM
    fma_rate = ARCH_RATES[gpu.arch]["fma"] * min(1.0, warps_per_scheduler / FMA_LATENCY)
    flops = 4 * t.shape.D * ideal_counts(t.shape, t.causal)["exps"] if dot_products and not t.totals()["tensor_flops"] else 0
    return fma_rate, flops



def _warps(t: Trace) -> int:
    """Warps in a CTA of the first launch."""
    return math.ceil(int(np.prod(t.launches[0].block)) / 32)


def warp_instructions(t: Trace, kernel: str, gpu: GpuSpec) -> tuple[np.ndarray | None, issue_model.LoopShape]:
    """Per CTA of the first launch, the warp instructions it issues (None where the SASS does not
    give them), and the key-tile loop that says so (attnlab.model.issue)."""
    spec = registry.get(kernel.split("@")[0], gpu.arch)
    entry = spec.launch_config(t.shape, gpu.sms)["entry"]
    loop = issue_model.loop_shape(spec.id, gpu.arch, entry)
    if loop.why_not is None and (problem := issue_model.trip_problem(loop, t.launches[0])):
        loop = dataclasses.replace(loop, why_not=problem)
    return issue_model.warp_instructions(loop, t.launches[0], _warps(t)), loop


def warp_stalls(t: Trace, loop: issue_model.LoopShape, outside: bool = False) -> np.ndarray | None:
    """Per CTA of the first launch, the cycles its warps wait out the stalls of the instructions they
    issue in the key-tile loop (summed over warps; None where warp_instructions gives no count);
    `outside`: issue.stall_cycles'."""
    return issue_model.stall_cycles(loop, t.launches[0], outside)


def in_turn(loop: issue_model.LoopShape | None, arch: str, warps: int) -> bool:
    """Whether, on `arch`, a scheduler waits out the stalls of `loop`'s warps one after another
    (STALLS_IN_TURN): only where a CTA's `warps` fill the SM's schedulers evenly, so that each holds
    the same share of every CTA and the busiest is any of them."""
    return (loop is not None and loop.marker in STALLS_IN_TURN.get(arch, ())
            and warps % SCHEDULERS_PER_SM == 0)


def _busiest_latency(owner: np.ndarray, stalled: np.ndarray, warps: int, resident: int, sms: int, hz: float) -> float:
    """The latency bound in seconds with the stalls overlapped: on each SM its CTAs' per-warp stalls,
    overlapped as many at a time as it holds (at most `resident`), the busiest SM's."""
    load = np.bincount(owner, weights=stalled / warps / hz, minlength=sms)
    held = np.minimum(resident, np.bincount(owner, minlength=sms))
    return float((load / np.maximum(held, 1)).max())


def _at_once(t: Trace, gpu: GpuSpec, resident: int) -> int:
    """CTAs an SM holds at a time: `resident`, or fewer where the grid does not fill them."""
    n = len(t.launches[0].blocks)
    return min(resident, math.ceil(n / gpu.sms)) if n else 1


def per_cta_seconds(t: Trace, gpu: GpuSpec, resident: int, dot_products: bool = True,
                    issued: np.ndarray | None = None, cuda: tuple[float, int] | None = None,
                    stalled: np.ndarray | None = None, turn: bool = False) -> dict[str, np.ndarray]:
    """Resource -> seconds of one SM's that resource each CTA of the first launch needs, from its
    counts at `gpu`'s rates (`resident` CTAs per SM; `dot_products` as bounds_of; `issued`, the
    warp instructions per CTA where known; `cuda`, _cuda_core_rate_and_flops if already worked out;
    `stalled`, warp_stalls where known: a CTA's warps each wait out their own, its share of an SM
    that holds `resident` CTAs at a time, or all of them where `turn` (in_turn); bounds_of takes
    each SM's own count)."""
    rates = ARCH_RATES[gpu.arch]
    hz = clock_ghz(gpu) * 1e9
    fma_rate, cuda_flops = cuda or _cuda_core_rate_and_flops(t, gpu, resident, dot_products)
    exps = t.per_cta("exps").astype(float)
    issue = {} if issued is None else {"instruction issue": issued / (SCHEDULERS_PER_SM * hz)}
    if stalled is not None:
        # in turn, a scheduler waits out its share of every CTA's warps (in_turn: an even share)
        issue["latency"] = stalled / (SCHEDULERS_PER_SM if turn else _warps(t) * resident) / hz
    return {
        "tensor cores": t.per_cta("tensor_flops") / (rates["tensor_flops"] * hz),
        "fp32 FMA": (exps / max(exps.sum(), 1) * cuda_flops / 2) / (fma_rate * hz),
        "shared memory": t.per_cta("shared_wavefronts") / hz,  # one wavefront per clock
        "L2 to SM": t.per_cta("global_sectors") * 32 / (L2_BYTES_PER_CLOCK_SM * hz),
        "exponentials": exps / (rates["exp"] * hz),
        "shuffles": t.per_cta("shuffles") * 32 / (rates["shuffle_lanes"] * hz),
        **issue,
    }


def per_cta_counted(t: Trace, kernel: str, gpu: GpuSpec) -> dict[str, np.ndarray]:
    """per_cta_seconds of `t` (traced for `kernel` on `gpu`) with every count predict weighs: the
    instruction issue and the latency the SASS gives, at the launch's resident CTAs."""
    issued, loop = warp_instructions(t, kernel, gpu)
    return per_cta_seconds(t, gpu, ctas_per_sm(kernel, t.shape, gpu), issued=issued,
                           stalled=None if issued is None else warp_stalls(t, loop),
                           turn=in_turn(loop, gpu.arch, _warps(t)))


def placement(per_cta: dict[str, np.ndarray], sms: int) -> np.ndarray:
    """Each CTA's SM: in launch order, each to the SM with the least work (its largest resource) so far."""
    return _schedule(np.max(np.stack(list(per_cta.values())), axis=0), sms)


def bounds_of(t: Trace, gpu: GpuSpec, resident: int, dot_products: bool = True,
              issue: tuple[np.ndarray | None, issue_model.LoopShape] | None = None,
              turn: bool | None = None, outside: bool = False) -> list[Bound]:
    """Every resource's bound, in µs, for the counts of `t` on `gpu` with `resident` CTAs per SM.
    `dot_products`: the launch computes the scores and P V (a fused kernel, not chapter 4's softmax),
    on CUDA cores where it runs no tensor-core instruction. `issue`: warp_instructions(...), for the
    instruction-issue bound (left out when None; not given, NaN, where the SASS does not give it).
    `turn`: whether the latency bound takes the stalls of a scheduler's warps in turn; None: in_turn.
    `outside`: the latency bound also counts the code outside the key-tile loop (issue.stall_cycles)."""
    rates = ARCH_RATES[gpu.arch]
    totals = t.totals()
    cuda = _cuda_core_rate_and_flops(t, gpu, resident, dot_products)
    issued, loop = issue if issue is not None else (None, None)
    stalled = warp_stalls(t, loop, outside) if issued is not None else None
    turn = in_turn(loop, gpu.arch, _warps(t)) if turn is None else turn
    per_cta = per_cta_seconds(t, gpu, resident, dot_products, issued, cuda, stalled, turn)
    owner = placement(per_cta, gpu.sms)
    n = len(owner)
    out = []
    for resource, secs in per_cta.items():
        if not n:
            busiest = 0.0
        elif resource == "latency" and not turn:  # each SM's own count of CTAs held at a time, not `resident`
            busiest = _busiest_latency(owner, stalled, _warps(t), resident, gpu.sms, clock_ghz(gpu) * 1e9)
        else:
            busiest = np.bincount(owner, weights=secs, minlength=gpu.sms).max()
        work = (_issue_text(issued, loop) if resource == "instruction issue"
                else _latency_text(stalled, resident, turn, outside) if resource == "latency"
                else _work_text(resource, totals, *cuda, rates))
        out.append(Bound(resource, busiest * 1e6, work))
    if loop is not None and issued is None:
        out.append(Bound("instruction issue", math.nan, _issue_text(None, loop)))
        out.append(Bound("latency", math.nan, _issue_text(None, loop)))
    dram = (totals["global_distinct_read"] + totals["global_distinct_write"]) / (gpu.dram_gbps * 1e9)
    out.append(Bound("DRAM", dram * 1e6, f"{totals['global_distinct_read'] + totals['global_distinct_write']:,} "
                                         f"distinct bytes at {gpu.dram_gbps:g} GB/s"))
    return out


def _issue_text(issued: np.ndarray | None, loop: issue_model.LoopShape) -> str:
    if issued is None:
        return f"not given: {loop.why_not}"
    return (f"{int(round(issued.sum())):,} warp instructions ({loop.inside} in the key-tile loop, "
            f"{loop.every_trip} of them on every trip and the rest on the trips their source line ran; "
            f"{loop.outside} outside it per warp) at {SCHEDULERS_PER_SM} per SM-clock")


def _latency_text(stalled: np.ndarray, resident: int, turn: bool, outside: bool = False) -> str:
    held = ("a scheduler's warps in turn (a tensor-core loop)" if turn else
            f"up to {resident} CTA{'s' if resident > 1 else ''} of an SM at a time")
    where = "the key-tile loop's instructions and every warp's code outside it" if outside else "the key-tile loop's instructions"
    return (f"{int(round(stalled.sum())):,} warp-cycles of the stalls ptxas wrote into {where}, "
            f"each warp waiting out its own, {held}")


def _work_text(resource: str, totals: dict, fma_rate: float, cuda_flops: int, rates: dict) -> str:
    return {
        "tensor cores": f"{totals['tensor_flops']:,} FLOP at {rates['tensor_flops']:g} per SM-clock",
        "fp32 FMA": f"{cuda_flops:,} FLOP at {2 * fma_rate:g} per SM-clock",
        "shared memory": f"{totals['shared_wavefronts']:,} wavefronts, one per SM-clock",
        "L2 to SM": f"{totals['global_sectors'] * 32:,} bytes in sectors at {L2_BYTES_PER_CLOCK_SM} per SM-clock",
        "exponentials": f"{totals['exps']:,} exponentials at {rates['exp']:g} per SM-clock",
        "shuffles": f"{totals['shuffles']:,} warp shuffles at one per SM-clock",
    }[resource]


def predict(kernel: str, shape: Shape, causal: bool = False, gpu: str = "L4", t: Trace | None = None,
            resident: int | None = None, turn: bool | None = None, outside: bool = False) -> Prediction:
    """The predicted time of `kernel` at `shape` on `gpu` (a key of gpus.GPUS), from its counts
    with that GPU's tiles and launch geometry (traced here, or `t`); `resident`: with that many CTAs
    per SM instead of the launch's occupancy, the counts the same (what freeing a resource buys);
    `turn`, `outside`: bounds_of's (None: by the loop; False: the loop's stalls alone)."""
    spec_gpu = by_key(gpu)
    if spec_gpu.arch not in ARCH_RATES or spec_gpu.arch not in SM_LIMITS:
        raise KeyError(f"no rates for {spec_gpu.arch}; the model knows {', '.join(ARCH_RATES)}")
    t = t or counted(kernel, shape, causal, spec_gpu)
    resident = resident or ctas_per_sm(kernel, shape, spec_gpu)
    hybrid = registry.get(kernel).runner == "attnlab.gpu.hybrid:run_cublas_hybrid"
    bounds = bounds_of(t, spec_gpu, resident, dot_products=not hybrid, issue=warp_instructions(t, kernel, spec_gpu),
                       turn=turn, outside=outside)
    extra = []
    launches = len(t.launches)
    if hybrid:
        extra = _gemm_bounds(shape, spec_gpu)
        launches += 2
    return Prediction(t.kernel, gpu, shape, causal, bounds, launches, sum(len(c.blocks) for c in t.launches),
                      resident, extra, t.heads_run)


def counted(kernel: str, shape: Shape, causal: bool, gpu: GpuSpec) -> Trace:
    """The counts the model takes for `kernel` at `shape` on `gpu`: every CTA run, or past
    RUN_EVERY_CTA CTAs (and where the heads are grid y alone) the first head's, every head counted alike."""
    spec = registry.get(kernel, gpu.arch)
    ctas = int(np.prod(spec.launch_config(shape, gpu.sms)["grid"]))
    if ctas > RUN_EVERY_CTA and one_head_grid(spec, shape, gpu.sms, causal) is not None:
        t = trace_one_head(kernel, shape, causal, arch=gpu.arch, sms=gpu.sms)
    else:
        t = trace(kernel, shape, causal, arch=gpu.arch, sms=gpu.sms)
    if not t.completed:  # the counts of part of the launch: every bound would come out too small
        raise RuntimeError(f"{kernel} at {shape.label()} on the {gpu.key}: the executor's count run did not complete "
                           "(its time limit, or a hang), so the model has no counts to predict from")
    return t


def gemm_operands(shape: Shape) -> list[tuple[str, str, int]]:
    """Chapter 4's two GEMMs, which the executor does not run (torch's matmul, cuBLAS on a GPU):
    (GEMM, tensor, bytes) for each operand moved once, fp16, the least any GEMM moves."""
    B, H, L, D = shape
    qkvo, s = 2 * B * H * L * D, 2 * B * H * L * L
    return [("GEMM S = Q K^T", "Q", qkvo), ("GEMM S = Q K^T", "K", qkvo), ("GEMM S = Q K^T", "S", s),
            ("GEMM O = P V", "P", s), ("GEMM O = P V", "V", qkvo), ("GEMM O = P V", "O", qkvo)]


def _gemm_bounds(shape: Shape, gpu: GpuSpec) -> list[Bound]:
    """Chapter 4's two cuBLAS GEMMs (S = Q K^T, O = P V), each at the larger of the tensor-core peak
    and DRAM for its operands (gemm_operands): the executor runs only the softmax between them."""
    B, H, L, D = shape
    flops = 2 * B * H * L * L * D
    out = []
    for name in dict.fromkeys(gemm for gemm, _, _ in gemm_operands(shape)):
        nbytes = sum(n for gemm, _, n in gemm_operands(shape) if gemm == name)
        secs = max(flops / (gpu.fp16_tflops * 1e12), nbytes / (gpu.dram_gbps * 1e9))
        out.append(Bound(name, secs * 1e6, f"{flops:,} FLOP, {nbytes:,} bytes"))
    return out

