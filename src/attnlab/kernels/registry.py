"""The one table of kernels. The book, the tests, the command line and the plots all read it.

Each entry names its source file and entry point, its launch geometry as functions of the
problem shape, and its limits. Launch geometry is what the launcher uses, the static inspection
checks and the book prints: there is no second copy of it anywhere.

Kernels with knobs (chapters 5-7: tile shape, warps, pipeline stages) also carry a `Tuning`: the
preprocessor defines their source reads (each `#ifdef NAME` around the chapter's constant) and one
geometry function of those values. `spec.with_config({"ATTN07_WARPS": 8})` returns the kernel built
that way: a copy whose `defines` reach the compiler (attnlab.kernels.compile) and whose block, grid and
dynamic shared memory follow from the same values, so the launcher runs it unchanged. Chapter 8's
search (attnlab.gpu.search) walks these spaces.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

from ..gpus import L4_MAX_SMEM_PER_BLOCK, max_smem_per_block  # noqa: F401 (L4_... is read from here)
from ..paths import kernels_dir
from ..shapes import Shape

DEFAULT_SMEM_LIMIT = 48 * 1024  # per block without the opt-in


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Knob:
    """One compile-time constant a kernel lets chapter 8's search set: the source reads the
    preprocessor define `name` when it is given and keeps the chapter's value (`default`) otherwise."""
    name: str                       # the define, e.g. "ATTN07_WARPS"
    values: tuple[int, ...]         # what the search may try (the default among them)
    default: int
    label: str                      # for tables and plots: "warps", "keys per tile (D=64)", ...
    head_dim: int | None = None     # the knob shapes only this head dim's code; None: every D


@dataclass(frozen=True)
class Tuning:
    """The knobs of a kernel and what follows from them.

    geometry(config) -> {"block": f, "grid": f, "dynamic_smem": f[, "kv_split": f, "at_split": g,
    "head_dims": set]}, each f a function of the Shape (g of the Shape and a split): the one description
    of the launch for every configuration, the chapter's included.
    rules(config, D) -> the reasons the kernel's static_asserts would refuse the configuration at
    head dim D (shared memory is checked separately, from the geometry).
    arch_defaults(arch) -> the knob values the chapter takes on architecture sm_XY where they differ
    from `defaults` (the values in the source, the L4's): chapter 7's key tile and stages follow
    the shared memory of the GPU at hand. None: the same values on every GPU.
    min_ctas: the knob that promises ptxas that many resident CTAs per SM (`__launch_bounds__`'s
    second argument, which sets the registers each thread may take); a configuration whose shared
    memory lets fewer CTAs share an SM breaks the promise and is refused. None: no such knob."""
    knobs: tuple[Knob, ...]
    geometry: Callable[[dict], dict]
    rules: Callable[[dict, int], list[str]] = lambda config, D: []
    arch_defaults: Callable[[str], dict] | None = None
    min_ctas: str | None = None

    @property
    def defaults(self) -> dict[str, int]:
        return {k.name: k.default for k in self.knobs}

    def defaults_on(self, arch: str | None) -> dict[str, int]:
        """The chapter's configuration on `arch` (None: the source's own values)."""
        if arch is None or self.arch_defaults is None:
            return self.defaults
        return {**self.defaults, **self.arch_defaults(arch)}

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(name)


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
    # Bytes every data pointer (q, k, v, out) must be a multiple of: 16 for kernels that load
    # 16-byte vectors (a contiguous view with a storage offset can break it). Checked before launch.
    alignment: int = 2
    # "module:function" that runs the whole computation around this kernel, for kernels that are
    # one step of it (the chapter 4 hybrid); None: the fused (q, k, v, o, L, D, scale, causal) launch.
    runner: str | None = None
    # Entries the runner launches besides the one launch_config names (FlashAttention-2's combine
    # kernel): built, inspected and profiled with the others, never launched on their own.
    helper_entries: tuple[str, ...] = ()
    # Kernels compiled once per head dim: D -> extern "C" entry (then `entry` is one of them);
    # None: `entry` serves every supported D.
    entries_by_head_dim: dict[int, str] | None = field(default=None, hash=False)
    # Knobs chapter 8 may set (None: the kernel has none), and the configuration this spec is built
    # with: sorted (define, value) pairs, empty for the chapter's own constants.
    tuning: Tuning | None = field(default=None, hash=False, compare=False)
    defines: tuple[tuple[str, int], ...] = ()
    # Kinds of shared-memory access ("ldmatrix", "cp.async", "ld/st") the chapter says never
    # conflict on banks; the CPU executor counts them and the CPU suite holds the kernel to it.
    conflict_free: tuple[str, ...] = ()
    # The chapter kernel this one is an ablation or a sweep variant of (None: a chapter's own kernel).
    # Sessions on a GPU run the chapters' own kernels first and these last.
    variant_of: str | None = None
    # Kernels that split each query tile's keys among warp groups of the CTA (chapter 7): the split
    # the launcher takes for a shape on the GPU at hand, and split -> (D -> entry) for every split
    # but 1 (whose entries are `entries_by_head_dim`). None: one split, 1, or the spec's own.
    # kv_split(shape, sms=None): sms names another GPU's SM count than the one at hand's.
    kv_split: Callable[..., int] = field(default=lambda s, sms=None: 1, hash=False, compare=False)
    entries_by_split: dict[int, dict[int, str]] | None = field(default=None, hash=False)
    # For those kernels, (shape, split) -> {"grid", "dynamic_smem"} at a given split: launch_config
    # takes the split once and derives the rest from it (one SM-count query per launch, not four).
    at_split: Callable[[Shape, int], dict] | None = field(default=None, hash=False, compare=False)
    # The architecture (sm_XY) whose tiles this build takes (for_arch); None: the source's own
    # constants, which are the L4's. `get` hands out every kernel built for the GPU at hand.
    arch: str | None = None

    @property
    def path(self):
        return kernels_dir() / self.source

    @property
    def tiles_follow_arch(self) -> bool:
        """Whether the kernel's tiles depend on the target (chapter 7's key tile and K/V stages do)."""
        return self.tuning is not None and self.tuning.arch_defaults is not None

    @property
    def config(self) -> dict[str, int]:
        """Every knob's value in this build (the defaults overlaid with `defines`); {} without knobs."""
        if self.tuning is None:
            return {}
        return {**self.tuning.defaults_on(self.arch), **dict(self.defines)}

    def with_config(self, config) -> "KernelSpec":
        """This kernel built with `config` (a dict or (define, value) pairs; knobs not named keep
        their values): a copy whose `defines` name every knob for the compiler and whose block, grid
        and dynamic shared memory are the tuning's geometry of the same values. The chapter's own
        configuration returns the registered spec itself. An unknown knob, or a value the knob does
        not list, is a ValueError."""
        given = dict(config.items() if isinstance(config, dict) else config)
        if not given:
            return self
        if self.tuning is None:
            raise ValueError(f"{self.id} has no knobs; it cannot take {sorted(given)}")
        known = {k.name: k for k in self.tuning.knobs}
        for name, value in given.items():
            if name not in known:
                raise ValueError(f"{self.id} has no knob {name!r}; its knobs: {', '.join(known)}")
            if value not in known[name].values:
                raise ValueError(f"{self.id}: {name}={value!r} is not one of {known[name].values}")
        full = {**self.config, **{n: int(v) for n, v in given.items()}}
        if full == self.tuning.defaults_on(self.arch):
            registered = KERNELS.get(self.id)
            if registered is not None and registered.tuning is self.tuning:
                return registered if self.arch is None else get(self.id, self.arch)
            base = dataclasses.replace(self, defines=(), arch=None, **self.tuning.geometry(self.tuning.defaults))
            return base.for_arch(self.arch)
        geometry = self.tuning.geometry(full)
        return dataclasses.replace(self, defines=tuple(sorted(full.items())), **geometry)

    def for_arch(self, arch: str | None) -> "KernelSpec":
        """This kernel with the tiles the chapter takes on `arch` (sm_XY; None: the source's own):
        defines for the compiler and the launch geometry of the same values, so the two never part.
        A configuration chapter 8 chose stays as it is; a kernel whose tiles are the same on every
        GPU returns itself."""
        if not self.tiles_follow_arch or arch == self.arch:
            return self
        if self.defines and dict(self.defines) != self.tuning.defaults_on(self.arch):  # a chosen configuration
            return dataclasses.replace(self, arch=arch)
        config = self.tuning.defaults_on(arch)
        if config == self.tuning.defaults:
            registered = KERNELS.get(self.id)
            if registered is not None and registered.tuning is self.tuning:
                return registered
            return dataclasses.replace(self, arch=None, defines=(), **self.tuning.geometry(config))
        return dataclasses.replace(self, arch=arch, defines=tuple(sorted(config.items())),
                                   **self.tuning.geometry(config))

    def config_problems(self, D: int, arch: str | None = None) -> list[str]:
        """Why this build cannot run head dim D on `arch`, before compiling it: the kernel's
        compile-time rules, shared memory over the limit per block of the target (`arch`, else the
        build's own, else the GPU at hand's; the L4's 99 KB without one), and shared memory that lets
        fewer CTAs share an SM than the `min_ctas` knob promises. Empty when it can. Name `arch`
        where the target is not the GPU at hand: a build whose tiles are the source's own carries no
        architecture of its own."""
        if self.tuning is None:
            return []
        from ..gpus import SM_LIMITS, arch_at_hand, occupancy

        arch = arch or self.arch
        problems = list(self.tuning.rules(self.config, D))
        shape = Shape(1, 1, 1, D)
        smem = self.dynamic_smem(shape)
        limit, whose = max_smem_per_block(arch)
        if smem > limit:
            problems.append(f"{smem} B of shared memory at D={D}, over {whose} {limit} B per block")
        arch = arch or arch_at_hand()[0]
        if self.tuning.min_ctas is not None and arch in SM_LIMITS and smem <= SM_LIMITS[arch].smem_per_block:
            promised = self.config[self.tuning.min_ctas]
            fit = occupancy(arch, math.prod(self.block(shape)), 0, smem)
            if fit.blocks_per_sm < promised:
                problems.append(f"{smem} B of shared memory at D={D} lets {fit.blocks_per_sm} CTA(s) share an "
                                f"{arch} SM, fewer than the {promised} that {self.tuning.min_ctas}={promised} "
                                f"budgets registers for")
        return problems

    def config_label(self) -> str:
        """The configuration in a few words ("default" for the chapter's own)."""
        if not self.defines:
            return "default"
        base = self.tuning.defaults_on(self.arch)
        return ", ".join(f"{n}={v}" for n, v in self.defines if v != base[n]) or "default"

    def entry_for(self, D: int) -> str:
        """The extern "C" entry point that runs head dim D (without a key split)."""
        return self.entries_by_head_dim[D] if self.entries_by_head_dim is not None else self.entry

    def entry_at(self, shape: Shape, split: int | None = None) -> str:
        """The entry the launcher runs at `shape`: entry_for(D), or the entry of the key split it
        takes there on the GPU at hand (or of `split`)."""
        split = self.kv_split(shape) if split is None else split
        if self.entries_by_split is not None and split != 1:
            return self.entries_by_split[split][shape.D]
        return self.entry_for(shape.D)

    def entries_at_head_dim(self, D: int) -> list[str]:
        """Every entry that may run head dim D, one per key split (several splits may share one)."""
        extra = [by_d[D] for by_d in (self.entries_by_split or {}).values() if D in by_d]
        return list(dict.fromkeys([self.entry_for(D)] + extra))

    def supports_head_dim(self, D: int) -> bool:
        if self.head_dims is not None:
            return D in self.head_dims
        return 1 <= D <= self.max_head_dim

    def head_dim_text(self) -> str:
        if self.head_dims is not None:
            dims = sorted(self.head_dims)
            steps = {b - a for a, b in zip(dims, dims[1:])}
            if len(dims) > 3 and len(steps) == 1:  # e.g. every multiple of 8 up to 128
                return f"{dims[0]}..{dims[-1]} step {steps.pop()}"
            return ", ".join(str(d) for d in dims)
        return f"1..{self.max_head_dim}"

    def launch_config(self, shape: Shape, sms: int | None = None, split: int | None = None) -> dict:
        """What the launcher runs at `shape`: grid, block, dynamic shared memory, the entry and the
        key split (1 for kernels without one), on the GPU at hand or on one of `sms` SMs, or with
        the key split `split` when it is given. Bench records keep it with each time;
        attnlab.records.fingerprint hashes it."""
        split = self.kv_split(shape, sms) if split is None else split
        at = (self.at_split(shape, split) if self.at_split is not None
              else {"grid": self.grid(shape), "dynamic_smem": self.dynamic_smem(shape)})
        return {"grid": at["grid"], "block": self.block(shape), "dynamic_smem": at["dynamic_smem"],
                "entry": self.entry_at(shape, split), "kv_split": split}


# Launch constants mirrored from the .cu files (tests/test_registry.py and
# tests/test_cpu_models*.py read them back from the sources).
_SCALAR_THREADS = 128  # must match THREADS in kernels/01_scalar.cu (checked by the tests)
_TILING_ROWS = 128     # ROWS in kernels/02_block_tiling.cu: query rows (threads) per block
_TILING_KEYS = 32      # KEYS in kernels/02_block_tiling.cu: keys per K/V tile
_TILING_Q_STRIDE = _TILING_ROWS + 2  # Q_STRIDE in kernels/02_block_tiling.cu
_WARP_KEYS = 32        # KEYS in kernels/03_warp_reductions.cu
_WARP_VEC = 8          # VEC in kernels/03_warp_reductions.cu: halves per lane (one 16-byte load)
_SOFTMAX_WARPS = 4     # WARPS in kernels/04_row_softmax.cu: rows (one per warp) per block


def _tiling_smem(D: int) -> int:
    """Q tile [D][Q_STRIDE] plus one K and one V tile [KEYS][D], fp16."""
    return (D * _TILING_Q_STRIDE + 2 * _TILING_KEYS * D) * 2


def _lanes_per_row(D: int) -> int:
    """lanes_per_row() of kernels/03_warp_reductions.cu: the smallest power of two G with G * 8 >= D."""
    g = 1
    while g * _WARP_VEC < D:
        g *= 2
    return g


def _warp_rows_per_block(warps: int, D: int) -> int:
    return warps * 32 // _lanes_per_row(D)


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
    conflict_free=("ld/st",),  # the column-major query tile
    summary="one thread per query row, fp32 online softmax on CUDA cores",
))

register(KernelSpec(
    id="02_block_tiling",
    chapter=2,
    title="Block tiling",
    source="02_block_tiling.cu",
    entry="attn_fwd_02_block_tiling",
    block=lambda s: (_TILING_ROWS, 1, 1),
    grid=lambda s: (_cdiv(s.L, _TILING_ROWS), s.B * s.H, 1),
    dynamic_smem=lambda s: _tiling_smem(s.D),
    conflict_free=("ld/st",),  # the padded, transposed Q tile and broadcast K/V reads
    summary="Q and K/V tiles in shared memory shared by a block's 128 rows; online softmax across tiles",
))

for _warps in (4, 8):
    register(KernelSpec(
        id=f"03_warp_rows_{_warps}w",
        chapter=3,
        title=f"Warp reductions, {_warps} warps",
        source="03_warp_reductions.cu",
        entry=f"attn_fwd_03_warp_rows_{_warps}w",
        block=lambda s, w=_warps: (w * 32, 1, 1),
        grid=lambda s, w=_warps: (_cdiv(s.L, _warp_rows_per_block(w, s.D)), s.B * s.H, 1),
        dynamic_smem=lambda s: 2 * 2 * _WARP_KEYS * s.D * 2,  # 2 buffers x (K, V) x KEYS x D halves
        head_dims=frozenset(range(8, 129, 8)),
        alignment=16,
        summary=f"lanes split D (16-byte loads), shuffle reductions, one barrier per tile; {_warps} warps",
    ))

register(KernelSpec(
    id="04_cublas_hybrid",
    chapter=4,
    title="cuBLAS hybrid",
    source="04_row_softmax.cu",
    entry="attn_softmax_04_rows",
    block=lambda s: (_SOFTMAX_WARPS * 32, 1, 1),
    grid=lambda s: (_cdiv(s.L, _SOFTMAX_WARPS), s.B * s.H, 1),
    runner="attnlab.gpu.hybrid:run_cublas_hybrid",
    # The runner is part of what a record measures: its source is hashed with the kernel's.
    extra_sources=("common.cuh", "../src/attnlab/gpu/hybrid.py"),
    summary="cuBLAS S = QK^T (fp16), a warp-per-row fp32 softmax kernel in place, cuBLAS P V",
))


# Chapters 5 and 6: the WMMA tile shared by both (kernels/wmma_tile.cuh), chapter 5's key tile and
# chapter 6's stages and producer warps. tests/test_kernels_05_06_static.py reads each constant
# back from the named source and the shared-memory sizes from the kernels' static_asserts.
_WMMA_BLOCK_M = 64        # BLOCK_M in kernels/wmma_tile.cuh: query rows per block
_WMMA_WARP_M = 16         # WARP_M in kernels/wmma_tile.cuh: query rows per compute warp
_WMMA_PAD_HALF = 8        # PAD_HALF in kernels/wmma_tile.cuh: padding of fp16 rows (halves)
_WMMA_PAD_FLOAT = 4       # PAD_FLOAT in kernels/wmma_tile.cuh: padding of fp32 rows (floats)
_WMMA_THREADS = 32 * _WMMA_BLOCK_M // _WMMA_WARP_M  # THREADS in kernels/05_wmma.cu (128)
_WMMA05_BLOCK_N = 64      # BLOCK_N in kernels/05_wmma.cu: keys per tile
_WS06_BLOCK_N = {64: 64, 128: 32}  # BLOCK_N<D> in kernels/06_warp_specialized.cu
# (stages, producer warps) of chapter 6's kernel and of its sweep variants, by registry id.
_WS06_VARIANTS = {"06_warp_specialized": (2, 1), "06_ws_s1_p1": (1, 1), "06_ws_s3_p1": (3, 1),
                  "06_ws_s1_p2": (1, 2), "06_ws_s2_p2": (2, 2), "06_ws_s3_p2": (3, 2)}


def _wmma_smem(D: int, block_n: int, kv_tiles: int, block_m: int = _WMMA_BLOCK_M) -> int:
    """Dynamic shared memory of chapters 5 and 6 (Tiles in kernels/wmma_tile.cuh): kv_tiles padded
    K/V tiles [block_n][D + 8] fp16, then S [block_m][block_n + 4] fp32, P [block_m][block_n + 8]
    fp16 and O [block_m][D + 4] fp32 (block_m = 64 query rows in the chapters)."""
    kv = block_n * (D + _WMMA_PAD_HALF) * 2
    s = block_m * (block_n + _WMMA_PAD_FLOAT) * 4
    p = block_m * (block_n + _WMMA_PAD_HALF) * 2
    o = block_m * (D + _WMMA_PAD_FLOAT) * 4
    return kv_tiles * kv + s + p + o


# Chapter 8's knobs of chapters 5 and 6 (the defines the sources read; the defaults are the
# chapters' constants above). BLOCK_M sets the compute warps: one per 16 query rows.
_WMMA_BLOCK_M_KNOB = Knob("ATTN_WMMA_BLOCK_M", (32, 64, 128), _WMMA_BLOCK_M, "query rows per block (16 per warp)")


def _wmma05_geometry(config: dict) -> dict:
    bm, bn = config["ATTN_WMMA_BLOCK_M"], config["ATTN05_BLOCK_N"]
    return {"block": lambda s: (32 * bm // _WMMA_WARP_M, 1, 1),
            "grid": lambda s: (_cdiv(s.L, bm), s.B * s.H, 1),
            "dynamic_smem": lambda s: _wmma_smem(s.D, bn, 2, bm)}


_WMMA05_TUNING = Tuning(
    knobs=(_WMMA_BLOCK_M_KNOB,
           Knob("ATTN05_BLOCK_N", (16, 32, 64, 128), _WMMA05_BLOCK_N, "keys per tile")),
    geometry=_wmma05_geometry)


def _ws06_geometry(config: dict) -> dict:
    bm, stages, producers = config["ATTN_WMMA_BLOCK_M"], config["ATTN06_STAGES"], config["ATTN06_PRODUCERS"]
    bn = {64: config["ATTN06_BLOCK_N_D64"], 128: config["ATTN06_BLOCK_N_D128"]}
    return {"block": lambda s: (32 * (bm // _WMMA_WARP_M + producers), 1, 1),
            "grid": lambda s: (_cdiv(s.L, bm), s.B * s.H, 1),
            "dynamic_smem": lambda s: _wmma_smem(s.D, bn.get(s.D, 32), 2 * stages, bm)}


def _ws06_rules(config: dict, D: int) -> list[str]:
    # Named barriers 1..2*STAGES (FULL and EMPTY per stage); the hardware has ids 0..15.
    if 2 * config["ATTN06_STAGES"] > 15:
        return [f"{config['ATTN06_STAGES']} stages need {2 * config['ATTN06_STAGES']} named barriers; ids 1..15 exist"]
    return []


_WS06_TUNING = Tuning(
    knobs=(_WMMA_BLOCK_M_KNOB,
           Knob("ATTN06_BLOCK_N_D64", (32, 64, 128), _WS06_BLOCK_N[64], "keys per tile (D=64)", head_dim=64),
           Knob("ATTN06_BLOCK_N_D128", (16, 32, 64), _WS06_BLOCK_N[128], "keys per tile (D=128)", head_dim=128),
           Knob("ATTN06_STAGES", (1, 2, 3, 4), _WS06_VARIANTS["06_warp_specialized"][0], "ring stages"),
           Knob("ATTN06_PRODUCERS", (1, 2), _WS06_VARIANTS["06_warp_specialized"][1], "producer warps")),
    geometry=_ws06_geometry, rules=_ws06_rules)


register(KernelSpec(
    id="05_wmma",
    chapter=5,
    title="WMMA",
    source="05_wmma.cu",
    entry="attn_fwd_05_wmma",
    **_wmma05_geometry(_WMMA05_TUNING.defaults),
    tuning=_WMMA05_TUNING,
    head_dims=frozenset({64, 128}),
    alignment=16,
    extra_sources=("common.cuh", "ptx.cuh", "wmma_tile.cuh"),
    summary="fused: WMMA 16x16x16 QK^T and PV (fp32 accumulate), scores and O staged in shared memory",
))

for _id, (_stages, _producers) in _WS06_VARIANTS.items():
    _default = _id == "06_warp_specialized"
    register(KernelSpec(
        id=_id,
        chapter=6,
        title="Warp specialization" + ("" if _default else f" ({_stages} stg, {_producers} prod)"),
        source="06_warp_specialized.cu" if _default else f"{_id}.cu",
        entry="attn_fwd_06_warp_specialized" if _default else f"attn_fwd_{_id}",
        # The sweep variants fix stages and producers in their own entry; only the chapter's kernel
        # takes chapter 8's knobs.
        **_ws06_geometry({**_WS06_TUNING.defaults, "ATTN06_STAGES": _stages, "ATTN06_PRODUCERS": _producers}),
        tuning=_WS06_TUNING if _default else None,
        head_dims=frozenset({64, 128}),
        alignment=16,
        extra_sources=("common.cuh", "ptx.cuh", "wmma_tile.cuh") + (() if _default else ("06_warp_specialized.cu",)),
        summary=("a producer warp cp.asyncs K/V into a 2-stage ring for 4 WMMA consumer warps; "
                 "named-barrier hand-off" if _default else
                 f"sweep variant of 06_warp_specialized: {_stages} stage{'s' * (_stages > 1)}, "
                 f"{_producers} producer warp{'s' * (_producers > 1)}"),
        variant_of=None if _default else "06_warp_specialized",
    ))


# Chapter 7 (kernels/07_mma_swizzle.cu): constants mirrored from the source, checked by
# tests/test_kernel_07_static.py. One entry per head dim (and key split); the ablations are separate ids.
_MMA07_WARPS = 4                     # WARPS: 16 query rows each
_MMA07_BLOCK_M = 16 * _MMA07_WARPS   # query rows per CTA without a key split
_MMA07_BLOCK_N = {64: 64, 128: 32}   # BLOCK_N_D64, BLOCK_N_D128: keys per K/V tile (the L4's)
_MMA07_STAGES = {64: 2, 128: 2}      # STAGES_D64, STAGES_D128: K/V stages (the L4's)
_MMA07_MIN_CTAS = 2                  # MIN_CTAS_PER_SM: __launch_bounds__'s CTAs per SM
_MMA07_MAX_BLOCK_N = 64              # the largest key tile _mma07_arch_tiles gives (registers, below)
_MMA07_MAX_STAGES = 3                # and the most stages it gives
# Registers per thread of the fused kernel's entries (ATTN07_ENTRY; D -> at most), as ptxas gives
# them for every tile _mma07_arch_tiles may take, which counts resident CTAs with it (FA2's route
# takes those tiles or less, _mma07_cta_split_tiles). tests/test_kernel_07_static.py holds each
# build to it. Registers move between CUDA toolkits: a build over the bound fails that test, and
# the bound moves with it.
_MMA07_REGISTERS = {64: 160, 128: 232}
# KV_SPLIT > 1 entries of 07_mma: split -> head dims (attn_fwd_07_mma_split{s}_d{D}). A split runs
# where its slice of the key tile is whole 16-key MMA steps: 4 at D = 128 needs the 64-key tile.
_MMA07_SPLIT_ENTRIES = {2: (64, 128), 4: (64, 128)}

# The launcher's choice of key split. The rule is ours, in the form of FlashAttention-2's
# num_splits_heuristic (csrc/flash_attn/flash_api.cpp): no split while the unsplit grid already
# covers SPLIT_FILL of the units it counts; otherwise the smallest split whose wave efficiency
# (CTAs / units over its ceiling) is within SPLIT_EFFICIENCY of the best split's. It differs from
# FA2's in the units: FA2 passes 2 x the SM count ("we're using 128 threads per block": two of its
# CTAs share an SM) and so fills CTA slots; the launcher passes the SM count and fills SMs, though
# two of our CTAs share an SM too. A split has a price an unsplit grid does not pay: inside the CTA,
# s times the CTAs each copy every K/V tile of their head (s times the L2-to-SM traffic); across
# CTAs, fp32 partials written, read back and merged by a second kernel. The rule pays it only for
# SMs that would otherwise hold no CTA, and leaves an SM's second CTA slot to latency hiding.
# kv_split(shape, 2 x SMs) is this rule at FA2's count; split_ctas.fa2_num_splits is FA2's own
# choice, with its own tiles; the fixed-split builds (07_mma_split2, 07_mma_split4) measure the
# splits the rule leaves out.
SPLIT_FILL = 0.8
SPLIT_EFFICIENCY = 0.85


def choose_kv_split(ctas_at, splits, sms: int) -> int:
    """The key split for a grid of ctas_at(s) CTAs at split s, among `splits`, on `sms` units (the
    launcher passes the SM count; FA2 would pass 2 x it)."""
    if 1 not in splits:
        raise ValueError(f"splits {splits} must hold 1")
    if ctas_at(1) >= SPLIT_FILL * sms:
        return 1
    efficiency = {s: (ctas_at(s) / sms) / -(-ctas_at(s) // sms) for s in splits}  # waves over whole waves
    best = max(efficiency.values())
    return min(s for s in splits if efficiency[s] >= SPLIT_EFFICIENCY * best)


# FlashAttention-2's route (the ablation 07_mma_split_ctas) takes its split from the same rule, over
# candidates formed the way FA2 forms its own: 1 .. min(128, units counted, key tiles), skipping a
# split that gives each CTA as many key tiles as one split fewer does (FA2's is_split_eligible).
# The key tiles are this kernel's (64 or 32 keys), not those of FA2's split kernel (256 keys at
# head dim 64, 128 at 128), and the units are the rule's (SMs, where FA2 counts 2 x SMs).
SPLIT_CTAS_MAX = 128
COMBINE_THREADS = 128  # COMBINE_THREADS in kernels/07_mma_swizzle.cu: attn_combine_07's block


def cta_split_candidates(n_tiles: int, sms: int) -> tuple[int, ...]:
    """The splits across CTAs weighed for `n_tiles` key tiles on `sms` units, as FlashAttention-2
    forms its candidates."""
    top = max(1, min(SPLIT_CTAS_MAX, sms, n_tiles))
    return tuple(s for s in range(1, top + 1) if s == 1 or _cdiv(n_tiles, s) != _cdiv(n_tiles, s - 1))


def _sms(sms: int | None) -> int:
    """`sms`, or the SM count of the GPU at hand (the L4's without one) when it is None."""
    if sms is None:
        from ..gpus import sm_count
        return sm_count()[0]
    return sms


def _mma07_splits(config: dict, D: int) -> tuple[int, ...]:
    """The key splits a build of `config` can run at head dim D: those with an entry whose
    split_fits() holds (whole warps per group, whole 16-key MMA steps per slice)."""
    warps, bn = config["ATTN07_WARPS"], config.get(f"ATTN07_BLOCK_N_D{D}")
    if bn is None:
        return (1,)
    return (1,) + tuple(s for s, dims in _MMA07_SPLIT_ENTRIES.items()
                        if D in dims and warps % s == 0 and bn % s == 0 and (bn // s) % 16 == 0)


def _mma07_smem(D: int, stages: int, block_m: int = _MMA07_BLOCK_M, block_n: dict | None = None,
                warps: int = _MMA07_WARPS) -> int:
    """Q tile + stages x (K tile + V tile), fp16: 40 KB (D=64) and 48 KB (D=128) double-buffered
    with the chapter's tiles and no split. With a key split the merge's partials reuse the stages:
    (split - 1) x (warps per group) x 32 lanes x (D/2 + 4) fp32 words, the larger of the two."""
    stages_bytes = stages * 2 * (block_n or _MMA07_BLOCK_N)[D] * 2 * D
    split = warps * 16 // block_m
    partials = (split - 1) * (warps // split) * 32 * (D // 2 + 4) * 4
    return 2 * D * block_m + max(stages_bytes, partials)


def _mma07_tiles(config: dict, stages: int | None = None) -> tuple[dict, dict]:
    """The key tile and the K/V stages per head dim of a build of `config` (`stages` fixes the
    stages, as the single-buffer ablation's entries do)."""
    bn = {D: config[f"ATTN07_BLOCK_N_D{D}"] for D in (64, 128)}
    return bn, {D: stages or config[f"ATTN07_STAGES_D{D}"] for D in (64, 128)}


def _mma07_geometry(config: dict, stages: int | None = None, split=None) -> dict:
    """Block, grid and shared memory of a build of `config`, and its key split: `split` fixes it
    (and the head dims are those whose tile it can split); None lets the launcher choose per shape,
    from the SM count of the GPU at hand."""
    warps = config["ATTN07_WARPS"]
    bn, st = _mma07_tiles(config, stages)

    def ctas(s: Shape, k: int) -> int:
        return _cdiv(s.L, 16 * warps // k) * s.B * s.H

    def kv_split(s: Shape, sms: int | None = None) -> int:
        if split is not None:
            return split
        return choose_kv_split(lambda k: ctas(s, k), _mma07_splits(config, s.D), _sms(sms))

    def at_split(s: Shape, k: int) -> dict:
        return {"grid": (_cdiv(s.L, 16 * warps // k), s.B * s.H, 1),
                "dynamic_smem": _mma07_smem(s.D, st[s.D], 16 * warps // k, bn, warps)}

    geometry = {"block": lambda s: (warps * 32, 1, 1),
                "grid": lambda s: at_split(s, kv_split(s))["grid"],
                "dynamic_smem": lambda s: at_split(s, kv_split(s))["dynamic_smem"],
                "kv_split": kv_split, "at_split": at_split}
    if split is None:  # the entries of the splits this build's tiles can take, per head dim
        geometry["entries_by_split"] = {s: {D: f"attn_fwd_07_mma_split{s}_d{D}" for D in dims if s in _mma07_splits(config, D)}
                                        for s, dims in _MMA07_SPLIT_ENTRIES.items()}
    elif split > 1:
        geometry["head_dims"] = frozenset(D for D in _MMA07_SPLIT_ENTRIES[split] if split in _mma07_splits(config, D))
    return geometry


def _mma07_arch_tiles(arch: str) -> dict[str, int]:
    """The key tile and the stages per head dim chapter 7 takes on `arch`, where they differ from
    the source's (the L4's). Resident CTAs per SM are counted by gpus.occupancy from gpus.SM_LIMITS,
    with the registers _MMA07_REGISTERS bounds.

    First the tile: the larger of 64 and 32 keys whose double-buffered CTA fits one block's shared
    memory and lets MIN_CTAS_PER_SM of them share an SM. At D = 128 that is 64 keys (80 KB) where an
    SM holds 164 KB (sm_80) or 228 KB (sm_90), and 32 keys (48 KB) on the 100 KB of sm_86 and sm_89.
    64 is the top because the scores live in registers (BLOCK_N / 2 fp32 per lane): with 64 keys at
    D = 128 a thread already holds about 230 of the 255 registers two CTAs leave it.

    Then the stages: the most, up to 3, that keep as many CTAs per SM as two stages do: a third
    stage hides copy latency, a resident CTA hides every latency, so the stage never costs a CTA.
    On sm_90 that is 3 at both head dims (registers hold three CTAs at D = 64 and two at D = 128
    either way); on sm_80 it is 2, where a third stage at D = 64 would leave two CTAs of the three
    the registers allow. An architecture the table lacks takes the source's tiles."""
    from ..gpus import SM_LIMITS, occupancy

    if arch not in SM_LIMITS:
        return {}
    lim, tiles = SM_LIMITS[arch], {}

    def ctas(D: int, bn: int, stages: int) -> int:
        smem = _mma07_smem(D, stages, block_n={D: bn})
        if smem > lim.smem_per_block:
            return 0
        return occupancy(arch, 32 * _MMA07_WARPS, _MMA07_REGISTERS[D], smem).blocks_per_sm

    for D in (64, 128):
        bn = _MMA07_MAX_BLOCK_N
        if ctas(D, bn, _MMA07_STAGES[D]) < _MMA07_MIN_CTAS:
            bn //= 2
        keep = max(_MMA07_MIN_CTAS, ctas(D, bn, _MMA07_STAGES[D]))
        stages = max(s for s in range(_MMA07_STAGES[D], _MMA07_MAX_STAGES + 1)
                     if s == _MMA07_STAGES[D] or ctas(D, bn, s) >= keep)
        if bn != _MMA07_BLOCK_N[D]:
            tiles[f"ATTN07_BLOCK_N_D{D}"] = bn
        if stages != _MMA07_STAGES[D]:
            tiles[f"ATTN07_STAGES_D{D}"] = stages
    return tiles


def _mma07_cta_split_geometry(config: dict) -> dict:
    """FlashAttention-2's route (07_mma_split_ctas): the unsplit CTA of `config`, and grid z = the
    split across CTAs the launcher takes for the shape on the GPU at hand."""
    warps = config["ATTN07_WARPS"]
    bn, st = _mma07_tiles(config)

    def kv_split(s: Shape, sms: int | None = None) -> int:
        sms = _sms(sms)
        ctas = _cdiv(s.L, 16 * warps) * s.B * s.H
        return choose_kv_split(lambda k: ctas * k, cta_split_candidates(_cdiv(s.L, bn[s.D]), sms), sms)

    def at_split(s: Shape, k: int) -> dict:
        return {"grid": (_cdiv(s.L, 16 * warps), s.B * s.H, k),
                "dynamic_smem": _mma07_smem(s.D, st[s.D], 16 * warps, bn, warps)}

    return {"block": lambda s: (warps * 32, 1, 1),
            "grid": lambda s: at_split(s, kv_split(s))["grid"],
            "dynamic_smem": lambda s: at_split(s, 1)["dynamic_smem"],
            "kv_split": kv_split, "at_split": at_split}


def _mma07_rules(config: dict, D: int) -> list[str]:
    """load_tile's static_assert: every thread copies the same number of 16-byte chunks of a K/V tile."""
    threads = 32 * config["ATTN07_WARPS"]
    bn = config[f"ATTN07_BLOCK_N_D{D}"] if D in (64, 128) else None
    if bn is not None and (bn * D // 8) % threads:
        return [f"a {bn}-key tile of D={D} is {bn * D // 8} 16-byte chunks, not a multiple of {threads} threads"]
    return []


_MMA07_TUNING = Tuning(
    knobs=(Knob("ATTN07_WARPS", (2, 4, 8), _MMA07_WARPS, "warps (16 query rows each)"),
           Knob("ATTN07_BLOCK_N_D64", (32, 64, 128), _MMA07_BLOCK_N[64], "keys per tile (D=64)", head_dim=64),
           Knob("ATTN07_BLOCK_N_D128", (16, 32, 64), _MMA07_BLOCK_N[128], "keys per tile (D=128)", head_dim=128),
           Knob("ATTN07_STAGES_D64", (2, 3), _MMA07_STAGES[64], "K/V stages (D=64)", head_dim=64),
           Knob("ATTN07_STAGES_D128", (2, 3), _MMA07_STAGES[128], "K/V stages (D=128)", head_dim=128),
           Knob("ATTN07_MIN_CTAS", (1, 2), _MMA07_MIN_CTAS, "CTAs per SM the registers are budgeted for (`__launch_bounds__`)")),
    geometry=_mma07_geometry, rules=_mma07_rules, arch_defaults=_mma07_arch_tiles, min_ctas="ATTN07_MIN_CTAS")


def _mma07_variant_tuning(geometry: Callable[[dict], dict], arch_defaults=_mma07_arch_tiles) -> Tuning:
    """The chapter-7 knobs and the tiles per architecture for an ablation or variant of 07_mma: each
    takes 07_mma's tiles on every GPU (chapter 8 searches only 07_mma itself, search.searchable)."""
    return dataclasses.replace(_MMA07_TUNING, geometry=geometry, arch_defaults=arch_defaults)


# Where FlashAttention-2's route takes less than 07_mma's tiles, because its partial kernel (the
# fused loop plus an fp32 epilogue, at the 255-register edge at D = 128) would spill with them:
# on sm_80 with 64-key tiles, on sm_90 with a third stage. arch -> (top key tile, top stages) per
# head dim. tests/test_kernel_07_static.py builds 07_mma's tiles to show each spill is still there.
_MMA07_PARTIAL_TOPS = {"sm_80": ({128: _MMA07_BLOCK_N[128]}, {}),
                       "sm_90": ({}, {128: _MMA07_STAGES[128]})}


def _mma07_cta_split_tiles(arch: str) -> dict[str, int]:
    """07_mma's tiles on `arch`, each capped by _MMA07_PARTIAL_TOPS: never more than the fused
    kernel's, so the ablation differs from it only where the partial kernel must (a smaller tile or
    fewer stages only lowers the shared memory, so two CTAs still share an SM)."""
    tiles = _mma07_arch_tiles(arch)
    top_block_n, top_stages = _MMA07_PARTIAL_TOPS.get(arch, ({}, {}))
    for knob, source, tops in (("BLOCK_N", _MMA07_BLOCK_N, top_block_n), ("STAGES", _MMA07_STAGES, top_stages)):
        for D, top in tops.items():
            name = f"ATTN07_{knob}_D{D}"
            value = min(tiles.get(name, source[D]), top)
            if value == source[D]:
                tiles.pop(name, None)
            else:
                tiles[name] = value
    return tiles


_MMA07_COMMON = dict(chapter=7, source="07_mma_swizzle.cu", head_dims=frozenset({64, 128}), alignment=16,
                     extra_sources=("common.cuh", "ptx.cuh", "swizzle.cuh"))

register(KernelSpec(
    id="07_mma",
    title="Swizzle + double buffer",
    entry="attn_fwd_07_mma_d64",
    entries_by_head_dim={D: f"attn_fwd_07_mma_d{D}" for D in (64, 128)},
    **_mma07_geometry(_MMA07_TUNING.defaults),
    **_MMA07_COMMON,
    summary="mma.sync m16n8k16 + ldmatrix from XOR-swizzled tiles, P in registers, double-buffered cp.async with "
            "one barrier per tile, causal tile skipping, keys split among warp groups when the grid is small",
    # Chapter 8 searches the kernel's knobs; the ablations and variants keep the chapter's constants.
    tuning=_MMA07_TUNING,
    conflict_free=("ldmatrix", "cp.async", "ld/st"),
))

# Fixed key splits: the launcher's other choices, measured side by side (sweep variants).
for _split, _dims in _MMA07_SPLIT_ENTRIES.items():
    register(KernelSpec(
        id=f"07_mma_split{_split}",
        title=f"Swizzle + double buffer (keys split {_split} ways)",
        entry=f"attn_fwd_07_mma_split{_split}_d{_dims[0]}",
        entries_by_head_dim={D: f"attn_fwd_07_mma_split{_split}_d{D}" for D in _dims},
        **{**_MMA07_COMMON, **_mma07_geometry(_MMA07_TUNING.defaults, split=_split)},
        tuning=_mma07_variant_tuning(lambda config, _s=_split: _mma07_geometry(config, split=_s)),
        summary=f"sweep variant of 07_mma: each tile's keys split among {_split} warp groups whatever the shape, "
                f"{16 * _MMA07_WARPS // _split}-row query tiles",
        conflict_free=("ldmatrix", "cp.async", "ld/st"),
        variant_of="07_mma",
    ))

for _kid, _suffix, _stages, _title, _summary in (
        ("07_mma_nosplit", "", None, "no split",
         "one warp group per CTA and 64-row query tiles whatever the GPU"),
        ("07_mma_two_barriers", "_two_barriers", None, "two barriers",
         "a second barrier per key tile (prefetch, wait, barrier, compute, barrier)"),
        ("07_mma_noswizzle", "_noswizzle", None, "no swizzle",
         "plain row-major tiles (8-way bank conflicts on every ldmatrix)"),
        ("07_mma_single_buffer", "_single_buffer", 1, "one stage",
         "one K/V stage, the next tile is copied only after this one is used (two barriers per tile)"),
        ("07_mma_longest_first", "_longest_first", 1, "no swizzle, one stage",
         "plain tiles and one K/V stage (the chapter's step 7.2)"),
        ("07_mma_plain", "_plain", 1, "no swizzle, one stage, launch order",
         "plain tiles, one K/V stage, causal query tiles in launch order (the chapter's step 7.1)")):
    register(KernelSpec(
        id=_kid,
        title=f"Swizzle + double buffer (ablation: {_title})",
        entry=f"attn_fwd_07_mma{_suffix}_d64",
        entries_by_head_dim={D: f"attn_fwd_07_mma{_suffix}_d{D}" for D in (64, 128)},
        **_mma07_geometry(_MMA07_TUNING.defaults, _stages, split=1),
        **_MMA07_COMMON,
        tuning=_mma07_variant_tuning(lambda config, _st=_stages: _mma07_geometry(config, _st, split=1)),
        summary=f"ablation of 07_mma without a key split: {_summary}",
        # The swizzle's promise; the unswizzled kernels exist to break it.
        conflict_free=() if _kid in ("07_mma_noswizzle", "07_mma_longest_first", "07_mma_plain")
        else ("ldmatrix", "cp.async", "ld/st"),
        variant_of="07_mma",
    ))


@dataclass(frozen=True)
class Step:
    """One step of chapter 7's climb: the kernel that adds `technique` to the step before it."""
    number: str        # "7.1", ...: the page's number
    kernel_id: str
    technique: str     # what this step adds, as the page's title says it
    page: str          # the notebook under book/ (without .ipynb)


# Chapter 7 in steps, each one template switch of kernels/07_mma_swizzle.cu away from the one before
# (attnlab.kernels.steps shows each step's code and its diff); the last is the chapter's kernel.
STEPS_07: tuple[Step, ...] = (
    Step("7.1", "07_mma_plain", "mma.sync, ldmatrix and P in registers", "ch07_1_mma"),
    Step("7.2", "07_mma_longest_first", "The longest query tiles first", "ch07_2_longest_first"),
    Step("7.3", "07_mma_single_buffer", "The XOR swizzle", "ch07_3_swizzle"),
    Step("7.4", "07_mma_two_barriers", "cp.async copies ahead of their use", "ch07_4_pipeline"),
    Step("7.5", "07_mma_nosplit", "One barrier per key tile", "ch07_5_one_barrier"),
    Step("7.6", "07_mma", "The keys split to fill the GPU", "ch07_6_key_split"),
)


# FlashAttention-2's route to a full GPU, for comparison: the keys split across CTAs (grid z), fp32
# partials in global memory, and a second kernel that combines them (attnlab.kernels.split_ctas). Split 1
# runs the unsplit kernel alone, as FA2 does.
register(KernelSpec(
    id="07_mma_split_ctas",
    title="Swizzle + double buffer (ablation: split across CTAs)",
    entry="attn_fwd_07_mma_d64",
    entries_by_head_dim={D: f"attn_fwd_07_mma_d{D}" for D in (64, 128)},
    entries_by_split={s: {D: f"attn_fwd_07_mma_partial_d{D}" for D in (64, 128)} for s in range(2, SPLIT_CTAS_MAX + 1)},
    helper_entries=("attn_combine_07",),
    **_mma07_cta_split_geometry(_MMA07_TUNING.defaults),
    tuning=_mma07_variant_tuning(_mma07_cta_split_geometry, _mma07_cta_split_tiles),
    **{**_MMA07_COMMON, "extra_sources": _MMA07_COMMON["extra_sources"] + ("../src/attnlab/kernels/split_ctas.py",)},
    runner="attnlab.gpu.launch:run_split_ctas",
    summary="ablation of 07_mma: FlashAttention-2's split, the keys cut across CTAs (grid z), fp32 partials "
            "in global memory merged by a second kernel",
    conflict_free=("ldmatrix", "cp.async", "ld/st"),
    variant_of="07_mma",
))


# (kernel id, arch) -> the registered kernel built for that architecture: made once each.
_BY_ARCH: dict[tuple[str, str], KernelSpec] = {}


def get(kernel_id: str, arch: str | None = None) -> KernelSpec:
    """The kernel built for `arch` (sm_XY), by default the GPU at hand's (the L4's sm_89 without
    one): its tiles, its defines and its launch geometry (KernelSpec.for_arch)."""
    try:
        spec = KERNELS[kernel_id]
    except KeyError:
        known = ", ".join(KERNELS)
        raise KeyError(f"unknown kernel {kernel_id!r}; registered: {known}") from None
    if not spec.tiles_follow_arch:
        return spec
    if arch is None:
        from ..gpus import arch_at_hand
        arch = arch_at_hand()[0]
    key = (kernel_id, arch)
    if key not in _BY_ARCH:
        _BY_ARCH[key] = spec.for_arch(arch)
    return _BY_ARCH[key]


def by_label(label: str) -> KernelSpec:
    """A kernel named as "<id>" (built for the GPU at hand) or "<id>@sm_XY" (built with the tiles it
    takes on that architecture): how the CPU suite and its mutants name the other tiles they run."""
    kernel_id, _, arch = label.partition("@")
    return get(kernel_id, arch or None)


def select(ids: list[str] | None, arch: str | None = None) -> list[KernelSpec]:
    """The kernels named on a command line, or all of them in chapter order, built for `arch` (the
    GPU at hand's by default)."""
    if not ids:
        ids = [s.id for s in sorted(KERNELS.values(), key=lambda s: (s.chapter, s.id))]
    return [get(i, arch) for i in ids]
