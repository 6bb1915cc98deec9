"""Chapter 7 (kernels/07_mma_swizzle.cu): mma.sync from swizzled tiles, its steps and its variants.

One entry per head dim (and key split); the steps, ablations and fixed splits are separate ids. The
tiles are the source's constants (the L4's); other GPUs take theirs from arch_tiles, which the
launcher passes to the compiler as defines.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from ...shapes import Shape
from ..spec import KernelSpec, Knob, Tuning, cdiv, register
from ..source_constants import constants, macro_calls

SOURCE = "07_mma_swizzle.cu"
_C = constants(SOURCE)
WARPS = _C["WARPS"]                                         # 16 query rows each
BLOCK_M = 16 * WARPS                                        # query rows per CTA without a key split
BLOCK_N = {64: _C["BLOCK_N_D64"], 128: _C["BLOCK_N_D128"]}  # keys per K/V tile (the L4's)
STAGES = {64: _C["STAGES_D64"], 128: _C["STAGES_D128"]}     # K/V stages (the L4's)
MIN_CTAS = _C["MIN_CTAS_PER_SM"]                            # __launch_bounds__'s CTAs per SM
BLOCK_N_D128_TWO_ROWS = _C["BLOCK_N_D128_TWO_ROWS"]         # the two-row key tile at D = 128, every GPU
COMBINE_THREADS = _C["COMBINE_THREADS"]                     # attn_combine_07's block
MAX_BLOCK_N = 64              # the largest key tile arch_tiles gives (registers, below)
MAX_STAGES = 3                # and the most stages it gives
# Registers per thread of the fused kernel's entries (ATTN07_ENTRY; D -> at most), as ptxas gives
# them for every tile arch_tiles may take, which counts resident CTAs with it (FA2's route
# takes those tiles or less, cta_split_tiles). tests/test_kernel_07_static.py holds each
# build to it. Registers move between CUDA toolkits: a build over the bound fails that test, and
# the bound moves with it. Step 7.13's entries set it (their P of the tile before, held across a
# trip: up to 167 at D = 64, under the 168 that still let three CTAs share an sm_90 SM, and 252 at
# D = 128, where P waits in fp32: 256 in the allocation's steps of 8 still let two CTAs share an SM,
# as 244 did).
REGISTERS = {64: 168, 128: 252}
# And of the entries with two 16-row blocks per warp (step 7.7's at D = 64, 07_mma_q_from_tile's at
# D = 128): two CTAs of 128 threads may hold 255 registers each (256 in the allocation's steps of 8),
# and ptxas takes nearly all of them (the unsplit two-row entry at D = 128 all 255 on sm_90, step
# 7.11's lean entry 253 on sm_80): the bound is that ceiling.
TWO_ROWS_REGISTERS = 255
# The source's ATTN07_ENTRY lines: entry name -> its template arguments by parameter name.
_ENTRIES = macro_calls(SOURCE, "ATTN07_ENTRY")


# KV_SPLIT > 1 entries of 07_mma: split -> head dims (attn_fwd_07_mma_split{s}_d{D}), from the
# source's ATTN07_ENTRY lines. A split runs where its slice of the key tile is whole 16-key MMA
# steps: 4 at D = 128 needs the 64-key tile.
def _split_entries(prefix: str) -> dict[int, tuple[int, ...]]:
    """split -> head dims of the source's entries named {prefix}_split{s}_d{D}."""
    out: dict[int, tuple[int, ...]] = {}
    for name, args in _ENTRIES.items():
        s = int(args["KV_SPLIT"])
        if s > 1 and name == f"{prefix}_split{s}_d{args['D']}":
            out[s] = out.get(s, ()) + (int(args["D"]),)
    return out


SPLIT_ENTRIES = _split_entries("attn_fwd_07_mma")

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
    return choose_even_split(ctas_at, splits, sms)


def choose_even_split(ctas_at, splits, sms: int) -> int:
    """The smallest key split whose CTAs spread over the `sms` SMs within SPLIT_EFFICIENCY as evenly
    as the most even split's: a split's wave efficiency is the average SM's CTAs over the busiest
    SM's (its waves over whole waves). Without a split (1) among `splits` this is the only test."""
    efficiency = {s: (ctas_at(s) / sms) / -(-ctas_at(s) // sms) for s in splits}
    best = max(efficiency.values())
    return min(s for s in splits if efficiency[s] >= SPLIT_EFFICIENCY * best)


# FlashAttention-2's route (the ablation 07_mma_split_ctas) takes its split from the same rule, over
# candidates formed the way FA2 forms its own: 1 .. min(128, units counted, key tiles), skipping a
# split that gives each CTA as many key tiles as one split fewer does (FA2's is_split_eligible).
# The key tiles are this kernel's (64 or 32 keys), not those of FA2's split kernel (256 keys at
# head dim 64, 128 at 128), and the units are the rule's (SMs, where FA2 counts 2 x SMs).
SPLIT_CTAS_MAX = 128


def cta_split_candidates(n_tiles: int, sms: int) -> tuple[int, ...]:
    """The splits across CTAs weighed for `n_tiles` key tiles on `sms` units, as FlashAttention-2
    forms its candidates."""
    top = max(1, min(SPLIT_CTAS_MAX, sms, n_tiles))
    return tuple(s for s in range(1, top + 1) if s == 1 or cdiv(n_tiles, s) != cdiv(n_tiles, s - 1))


def _sms(sms: int | None) -> int:
    """`sms`, or the SM count of the GPU at hand (the L4's without one) when it is None."""
    if sms is None:
        from ...gpus import sm_count
        return sm_count()[0]
    return sms


def splits_at(config: dict, D: int, split_entries: dict | None = None) -> tuple[int, ...]:
    """The key splits a build of `config` can run at head dim D: those with an entry (in
    `split_entries`, 07_mma's without) whose split_fits() holds (whole warps per group, whole
    16-key MMA steps per slice)."""
    warps, bn = config["ATTN07_WARPS"], config.get(f"ATTN07_BLOCK_N_D{D}")
    if bn is None:
        return (1,)
    return (1,) + tuple(s for s, dims in (split_entries or SPLIT_ENTRIES).items()
                        if D in dims and warps % s == 0 and bn % s == 0 and (bn // s) % 16 == 0)


def smem(D: int, stages: int, block_m: int = BLOCK_M, block_n: dict | None = None,
                warps: int = WARPS, row_blocks: int = 1) -> int:
    """Q tile + stages x (K tile + V tile), fp16: 40 KB (D=64) and 48 KB (D=128) double-buffered
    with the chapter's tiles and no split. With a key split the merge's partials reuse the stages:
    (split - 1) x (warps per group) x row_blocks x 32 lanes x (D/2 + 4) fp32 words, the larger of
    the two (row_blocks: the 16-row blocks each warp takes)."""
    stages_bytes = stages * 2 * (block_n or BLOCK_N)[D] * 2 * D
    split = warps * 16 * row_blocks // block_m
    partials = (split - 1) * (warps // split) * row_blocks * 32 * (D // 2 + 4) * 4
    return 2 * D * block_m + max(stages_bytes, partials)


def _tiles(config: dict, stages: int | None = None) -> tuple[dict, dict]:
    """The key tile and the K/V stages per head dim of a build of `config` (`stages` fixes the
    stages, as the single-buffer ablation's entries do)."""
    bn = {D: config[f"ATTN07_BLOCK_N_D{D}"] for D in (64, 128)}
    return bn, {D: stages or config[f"ATTN07_STAGES_D{D}"] for D in (64, 128)}


ONE_ROW_BLOCK = {64: 1, 128: 1}


def geometry(config: dict, stages: int | None = None, split=None, row_blocks: dict = ONE_ROW_BLOCK,
             split_entries: dict[int, dict[int, str]] | None = None) -> dict:
    """Block, grid and shared memory of a build of `config`, and its key split: `split` fixes it
    (and the head dims are those whose tile it can split); None lets the launcher choose per shape,
    from the SM count of the GPU at hand. `row_blocks`: the 16-row query blocks each warp takes,
    per head dim; `split_entries`: split -> (D -> entry) of the splits past 1 (07_mma's without)."""
    warps = config["ATTN07_WARPS"]
    bn, st = _tiles(config, stages)
    if split_entries is None:
        split_entries = {s: {D: f"attn_fwd_07_mma_split{s}_d{D}" for D in dims} for s, dims in SPLIT_ENTRIES.items()}

    def rows(s: Shape, k: int) -> int:  # query rows per CTA at split k
        return 16 * row_blocks[s.D] * warps // k

    def ctas(s: Shape, k: int) -> int:
        return cdiv(s.L, rows(s, k)) * s.B * s.H

    def kv_split(s: Shape, sms: int | None = None) -> int:
        if split is not None:
            return split
        return choose_kv_split(lambda k: ctas(s, k), splits_at(config, s.D, split_entries), _sms(sms))

    def at_split(s: Shape, k: int) -> dict:
        return {"grid": (cdiv(s.L, rows(s, k)), s.B * s.H, 1),
                "dynamic_smem": smem(s.D, st[s.D], rows(s, k), bn, warps, row_blocks[s.D])}

    geometry = {"block": lambda s: (warps * 32, 1, 1),
                "grid": lambda s: at_split(s, kv_split(s))["grid"],
                "dynamic_smem": lambda s: at_split(s, kv_split(s))["dynamic_smem"],
                "kv_split": kv_split, "at_split": at_split}
    if split is None:  # the entries of the splits this build's tiles can take, per head dim
        geometry["entries_by_split"] = {s: {D: e for D, e in by_d.items() if s in splits_at(config, D, split_entries)}
                                        for s, by_d in split_entries.items()}
    elif split > 1:
        geometry["head_dims"] = frozenset(D for D in SPLIT_ENTRIES[split] if split in splits_at(config, D))
    return geometry


def arch_tiles(arch: str) -> dict[str, int]:
    """The key tile and the stages per head dim chapter 7 takes on `arch`, where they differ from
    the source's (the L4's). Resident CTAs per SM are counted by gpus.occupancy from gpus.SM_LIMITS,
    with the registers REGISTERS bounds.

    First the tile: the larger of 64 and 32 keys whose double-buffered CTA fits one block's shared
    memory and lets MIN_CTAS_PER_SM of them share an SM. At D = 128 that is 64 keys (80 KB) where an
    SM holds 164 KB (sm_80) or 228 KB (sm_90), and 32 keys (48 KB) on the 100 KB of sm_86 and sm_89.
    64 is the top because the scores live in registers (BLOCK_N / 2 fp32 per lane): with 64 keys at
    D = 128 a thread already holds up to REGISTERS[128] of the 255 registers two CTAs leave it.

    Then the stages: the most, up to 3, that keep as many CTAs per SM as two stages do: a third
    stage hides copy latency, a resident CTA hides every latency, so the stage never costs a CTA.
    On sm_90 that is 3 at both head dims (registers hold three CTAs at D = 64 and two at D = 128
    either way); on sm_80 it is 2, where a third stage at D = 64 would leave two CTAs of the three
    the registers allow. An architecture the table lacks takes the source's tiles."""
    from ...gpus import SM_LIMITS, occupancy

    if arch not in SM_LIMITS:
        return {}
    lim, tiles = SM_LIMITS[arch], {}

    def ctas(D: int, bn: int, stages: int) -> int:
        need = smem(D, stages, block_n={D: bn})
        if need > lim.smem_per_block:
            return 0
        return occupancy(arch, 32 * WARPS, REGISTERS[D], need).blocks_per_sm

    for D in (64, 128):
        bn = MAX_BLOCK_N
        if ctas(D, bn, STAGES[D]) < MIN_CTAS:
            bn //= 2
        keep = max(MIN_CTAS, ctas(D, bn, STAGES[D]))
        stages = max(s for s in range(STAGES[D], MAX_STAGES + 1)
                     if s == STAGES[D] or ctas(D, bn, s) >= keep)
        if bn != BLOCK_N[D]:
            tiles[f"ATTN07_BLOCK_N_D{D}"] = bn
        if stages != STAGES[D]:
            tiles[f"ATTN07_STAGES_D{D}"] = stages
    return tiles


def cta_split_geometry(config: dict) -> dict:
    """FlashAttention-2's route (07_mma_split_ctas): the unsplit CTA of `config`, and grid z = the
    split across CTAs the launcher takes for the shape on the GPU at hand."""
    warps = config["ATTN07_WARPS"]
    bn, st = _tiles(config)

    def kv_split(s: Shape, sms: int | None = None) -> int:
        sms = _sms(sms)
        ctas = cdiv(s.L, 16 * warps) * s.B * s.H
        return choose_kv_split(lambda k: ctas * k, cta_split_candidates(cdiv(s.L, bn[s.D]), sms), sms)

    def at_split(s: Shape, k: int) -> dict:
        return {"grid": (cdiv(s.L, 16 * warps), s.B * s.H, k),
                "dynamic_smem": smem(s.D, st[s.D], 16 * warps, bn, warps)}

    return {"block": lambda s: (warps * 32, 1, 1),
            "grid": lambda s: at_split(s, kv_split(s))["grid"],
            "dynamic_smem": lambda s: at_split(s, 1)["dynamic_smem"],
            "kv_split": kv_split, "at_split": at_split}


def rules(config: dict, D: int) -> list[str]:
    """load_tile's static_assert: every thread copies the same number of 16-byte chunks of a K/V tile."""
    threads = 32 * config["ATTN07_WARPS"]
    bn = config[f"ATTN07_BLOCK_N_D{D}"] if D in (64, 128) else None
    if bn is not None and (bn * D // 8) % threads:
        return [f"a {bn}-key tile of D={D} is {bn * D // 8} 16-byte chunks, not a multiple of {threads} threads"]
    return []


TUNING = Tuning(
    knobs=(Knob("ATTN07_WARPS", (2, 4, 8), WARPS, "warps (16 query rows each)"),
           Knob("ATTN07_BLOCK_N_D64", (32, 64, 128), BLOCK_N[64], "keys per tile (D=64)", head_dim=64),
           Knob("ATTN07_BLOCK_N_D128", (16, 32, 64), BLOCK_N[128], "keys per tile (D=128)", head_dim=128),
           Knob("ATTN07_STAGES_D64", (2, 3), STAGES[64], "K/V stages (D=64)", head_dim=64),
           Knob("ATTN07_STAGES_D128", (2, 3), STAGES[128], "K/V stages (D=128)", head_dim=128),
           Knob("ATTN07_MIN_CTAS", (1, 2), MIN_CTAS, "CTAs per SM the registers are budgeted for (`__launch_bounds__`)")),
    geometry=geometry, rules=rules, arch_defaults=arch_tiles, min_ctas="ATTN07_MIN_CTAS")


def variant_tuning(geometry: Callable[[dict], dict], arch_defaults=arch_tiles) -> Tuning:
    """The chapter-7 knobs and the tiles per architecture for an ablation or variant of 07_mma: each
    takes 07_mma's tiles on every GPU (chapter 8 searches only 07_mma itself, search.searchable)."""
    return dataclasses.replace(TUNING, geometry=geometry, arch_defaults=arch_defaults)


# Where FlashAttention-2's route takes less than 07_mma's tiles, because its partial kernel (the
# fused loop plus an fp32 epilogue, at the 255-register edge at D = 128) would spill with them:
# on sm_80 with 64-key tiles. arch -> (top key tile, top stages) per head dim.
# tests/test_kernel_07_static.py builds 07_mma's tiles to show each spill is still there, and that
# no other target spills (sm_90's third stage did, until the (batch, head) index of step 7.8 moved
# ptxas's allocation: 255 registers and no spill now).
PARTIAL_TOPS = {"sm_80": ({128: BLOCK_N[128]}, {})}


def cta_split_tiles(arch: str) -> dict[str, int]:
    """07_mma's tiles on `arch`, each capped by PARTIAL_TOPS: never more than the fused
    kernel's, so the ablation differs from it only where the partial kernel must (a smaller tile or
    fewer stages only lowers the shared memory, so two CTAs still share an SM)."""
    tiles = arch_tiles(arch)
    top_block_n, top_stages = PARTIAL_TOPS.get(arch, ({}, {}))
    for knob, source, tops in (("BLOCK_N", BLOCK_N, top_block_n), ("STAGES", STAGES, top_stages)):
        for D, top in tops.items():
            name = f"ATTN07_{knob}_D{D}"
            value = min(tiles.get(name, source[D]), top)
            if value == source[D]:
                tiles.pop(name, None)
            else:
                tiles[name] = value
    return tiles


COMMON = dict(chapter=7, source="07_mma_swizzle.cu", head_dims=frozenset({64, 128}), alignment=16,
                     extra_sources=("common.cuh", "ptx.cuh", "swizzle.cuh"))

register(KernelSpec(
    id="07_mma",
    title="Swizzle + double buffer",
    entry="attn_fwd_07_mma_d64",
    entries_by_head_dim={D: f"attn_fwd_07_mma_d{D}" for D in (64, 128)},
    **geometry(TUNING.defaults),
    **COMMON,
    summary="mma.sync m16n8k16 + ldmatrix from XOR-swizzled tiles, P in registers, double-buffered cp.async with "
            "one barrier per tile, causal tile skipping, keys split among warp groups when the grid is small",
    # Chapter 8 searches the kernel's knobs; the ablations and variants keep the chapter's constants.
    tuning=TUNING,
    conflict_free=("ldmatrix", "cp.async", "ld/st"),
))

# Fixed key splits: the launcher's other choices, measured side by side (sweep variants).
for _split, _dims in SPLIT_ENTRIES.items():
    register(KernelSpec(
        id=f"07_mma_split{_split}",
        title=f"Swizzle + double buffer (keys split {_split} ways)",
        entry=f"attn_fwd_07_mma_split{_split}_d{_dims[0]}",
        entries_by_head_dim={D: f"attn_fwd_07_mma_split{_split}_d{D}" for D in _dims},
        **{**COMMON, **geometry(TUNING.defaults, split=_split)},
        tuning=variant_tuning(lambda config, _s=_split: geometry(config, split=_s)),
        summary=f"sweep variant of 07_mma: each tile's keys split among {_split} warp groups whatever the shape, "
                f"{16 * WARPS // _split}-row query tiles",
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
        **geometry(TUNING.defaults, _stages, split=1),
        **COMMON,
        tuning=variant_tuning(lambda config, _st=_stages: geometry(config, _st, split=1)),
        summary=f"ablation of 07_mma without a key split: {_summary}",
        # The swizzle's promise; the unswizzled kernels exist to break it.
        conflict_free=() if _kid in ("07_mma_noswizzle", "07_mma_longest_first", "07_mma_plain")
        else ("ldmatrix", "cp.async", "ld/st"),
        variant_of="07_mma",
    ))


# The steps past 07_mma (7.7, 7.8, ...): the entries named {prefix}_d{D} and {prefix}_split{s}_d{D}
# in the source; where a head dim has none, those of `fallback`, the step whose entries it runs there
# (07_mma's for step 7.7 at D = 128, whose two row blocks' accumulators would pass 255 registers).
# The row blocks per head dim are those of the source's ATTN07_ENTRY lines.


@dataclass(frozen=True)
class LaterStep:
    prefix: str  # the source's entry names start with it
    fallback: str = "attn_fwd_07_mma"  # the prefix of the entries it runs at a head dim it has none of
    # The key tile its own entries at D = 128 take on every GPU, where not the build's (the two-row
    # entries of Q_FROM_TILE: BLOCK_N_D128_TWO_ROWS in the source).
    block_n_d128: int | None = None

    @property
    def entries(self) -> dict[int, str]:
        return {D: f"{self.prefix}_d{D}" if f"{self.prefix}_d{D}" in _ENTRIES else f"{self.fallback}_d{D}"
                for D in (64, 128)}

    @property
    def row_blocks(self) -> dict[int, int]:
        return {D: int(_ENTRIES[e]["ROW_BLOCKS"]) for D, e in self.entries.items()}

    @property
    def split_entries(self) -> dict[int, dict[int, str]]:
        """split -> (D -> entry) of the key splits past 1 the step runs: its own entries, and
        its fallback's at a head dim where the step runs those."""
        out: dict[int, dict[int, str]] = {}
        for name, args in _ENTRIES.items():
            s, D = int(args["KV_SPLIT"]), int(args["D"])
            inherited = name == f"{self.fallback}_split{s}_d{D}" and self.entries[D] == f"{self.fallback}_d{D}"
            if s > 1 and (name == f"{self.prefix}_split{s}_d{D}" or inherited):
                out.setdefault(s, {})[D] = name
        return {s: dict(sorted(out[s].items())) for s in sorted(out)}

    def tiles(self, config: dict) -> dict:
        """`config` with the key tile the step's D = 128 entries take."""
        own = self.block_n_d128 is not None and self.entries[128] == f"{self.prefix}_d128"
        return {**config, "ATTN07_BLOCK_N_D128": self.block_n_d128} if own else config

    def geometry(self, config: dict) -> dict:
        return geometry(self.tiles(config), row_blocks=self.row_blocks, split_entries=self.split_entries)


# Step 7.7: each warp takes two 16-row query blocks (128-row CTAs at D = 64), and every K and V
# fragment it reads from shared memory feeds both blocks' MMAs: half the ldmatrix bytes per FLOP.
TWO_ROWS = LaterStep("attn_fwd_07_mma_two_row_blocks")
TWO_ROWS_ENTRY, TWO_ROWS_BLOCKS = TWO_ROWS.entries, TWO_ROWS.row_blocks
# Step 7.8: step 7.7 with a causal grid's longest query tiles first across every head, not per head.
ACROSS_HEADS = LaterStep("attn_fwd_07_mma_across_heads")
# Step 7.11's two launches: steps 7.6 and 7.8 with the lean key-tile loop (below).
LEAN = LaterStep("attn_fwd_07_mma_lean")
LEAN_ACROSS_HEADS = LaterStep("attn_fwd_07_mma_lean_across_heads")
LEAN_SUMMARY = "with less scalar work per key tile: whole K/V tiles copied without row tests, the rescale of O " \
               "skipped where no row's max rose"
# Step 7.12's: steps 7.6 and 7.8 with step 7.11's whole-tile copy and not its vote (below).
WHOLE_TILES = LaterStep("attn_fwd_07_mma_whole_tiles")
WHOLE_TILES_ACROSS_HEADS = LaterStep("attn_fwd_07_mma_whole_tiles_across_heads")
WHOLE_TILES_SUMMARY = "with step 7.11's whole-tile copy of K and V (no row tests inside L) and the rescale of O " \
                      "on every tile, as before step 7.11"
# Step 7.13's: step 7.12's with each tile's O += P V a tile later, between the next tile's scores and
# its softmax (below).
DEFERRED_PV = LaterStep("attn_fwd_07_mma_deferred_pv")
DEFERRED_PV_ACROSS_HEADS = LaterStep("attn_fwd_07_mma_deferred_pv_across_heads",
                                     fallback="attn_fwd_07_mma_whole_tiles_across_heads")  # at D = 64
# The ablation that weighs the deferral with two row blocks at D = 64, where step 7.13 keeps step 7.12's
# entries (07_mma_deferred_pv_two_rows: step 7.13's two-row launch with the deferral there too).
DEFERRED_PV_TWO_ROWS = LaterStep("attn_fwd_07_mma_deferred_pv_two_rows", fallback="attn_fwd_07_mma_deferred_pv_across_heads")
# The two-row launch of the ablation 07_mma_two_rows_at_d128 (below): step 7.12's two-row entries with two row blocks at D = 128 too, Q's
# fragments read from its tile at every k-step (Q_FROM_TILE in the source), 32-key tiles on every GPU.
Q_FROM_TILE = LaterStep("attn_fwd_07_mma_q_from_tile", fallback="attn_fwd_07_mma_whole_tiles_across_heads",
                        block_n_d128=BLOCK_N_D128_TWO_ROWS)
DEFERRED_PV_SUMMARY = "with each tile's O += P V a tile later: its MMAs run between the next tile's scores and " \
                      "their softmax, which does not wait on them"

for _kid, _step, _title, _summary, _extra in (
        ("07_mma_two_row_blocks", TWO_ROWS, "two row blocks per warp",
         "07_mma with two 16-row query blocks per warp at D = 64 (128-row CTAs): each K and V fragment read "
         "from shared memory feeds the MMAs of both", {}),
        ("07_mma_across_heads", ACROSS_HEADS, "two row blocks, longest first across the heads",
         "step 7.7, and a causal grid launches every head's longest query tile before any head's next",
         {"causal_heads_first": True}),
        ("07_mma_lean", LEAN, "one row block, lean loop",
         f"step 7.6 (one row block, its key split) {LEAN_SUMMARY}", {}),
        ("07_mma_lean_across_heads", LEAN_ACROSS_HEADS, "two row blocks, lean loop",
         f"step 7.8 {LEAN_SUMMARY}", {"causal_heads_first": True}),
        ("07_mma_whole_tiles", WHOLE_TILES, "one row block, whole-tile copy",
         f"step 7.6 (one row block, its key split) {WHOLE_TILES_SUMMARY}", {}),
        ("07_mma_whole_tiles_across_heads", WHOLE_TILES_ACROSS_HEADS, "two row blocks, whole-tile copy",
         f"step 7.8 {WHOLE_TILES_SUMMARY}", {"causal_heads_first": True}),
        ("07_mma_deferred_pv", DEFERRED_PV, "one row block, O += P V a tile later",
         f"07_mma_whole_tiles (step 7.12's one-row launch) {DEFERRED_PV_SUMMARY}", {}),
        ("07_mma_deferred_pv_across_heads", DEFERRED_PV_ACROSS_HEADS, "two row blocks, O += P V a tile later",
         f"07_mma_whole_tiles_across_heads (step 7.12's two-row launch) {DEFERRED_PV_SUMMARY} (at D = 128; "
         "at D = 64, two row blocks, step 7.12's)",
         {"causal_heads_first": True}),
        ("07_mma_q_from_tile", Q_FROM_TILE, "two row blocks at D = 128, Q read from its tile",
         "07_mma_whole_tiles_across_heads (step 7.12's two-row launch) with two row blocks at D = 128 too: "
         f"{BLOCK_N_D128_TWO_ROWS}-key tiles on every GPU, Q's fragments read from its tile at every k-step",
         {"causal_heads_first": True}),
        ("07_mma_deferred_pv_two_rows", DEFERRED_PV_TWO_ROWS, "two row blocks, O += P V a tile later at both head dims",
         f"ablation of step 7.13's two-row launch: 07_mma_whole_tiles_across_heads {DEFERRED_PV_SUMMARY}, at D = 64 "
         "too, where step 7.13 keeps step 7.12's loop", {"causal_heads_first": True})):
    register(KernelSpec(
        id=_kid,
        title=f"Swizzle + double buffer, {_title}",
        entry=_step.entries[64],
        entries_by_head_dim=_step.entries,
        **_step.geometry(TUNING.defaults),
        **COMMON,
        tuning=variant_tuning(_step.geometry),
        summary=_summary,
        conflict_free=("ldmatrix", "cp.async", "ld/st"),
        variant_of="07_mma",
        **_extra,
    ))


# Step 7.9: two row blocks pay where their unsplit grid fills the GPU and cost where the launcher
# must split their keys four ways to fill it (step 7.7's page). The launcher takes step 7.8's
# launch where its unsplit grid covers SPLIT_FILL of the SMs, and step 7.6's (one row block, with
# its key split) where it does not: the same test the split rule makes, asked one row block sooner.
ROWS_THAT_FILL = ("07_mma", "07_mma_across_heads")


def _two_launches(one: dict, two: dict, choose: Callable) -> dict:
    """The geometry of a launcher step over step 7.6's launch (`one`) and step 7.8's (`two`), where
    choose(shape, sms=None) gives (0 for one, 1 for two; the key split) on the GPU at hand or one of
    `sms` SMs: grid, dynamic_smem and at_split follow the choice on the GPU at hand, launch_config
    takes another GPU's SM count through KernelSpec.runs."""
    def at(s: Shape, k: int) -> dict:
        return (one, two)[choose(s)[0]]["at_split"](s, k)

    return {"block": two["block"], "grid": lambda s: at(s, choose(s)[1])["grid"],
            "dynamic_smem": lambda s: at(s, choose(s)[1])["dynamic_smem"],
            "kv_split": lambda s, sms=None: choose(s, sms)[1], "at_split": at,
            "entries_by_split": two["entries_by_split"], "choice": lambda s, sms=None: choose(s, sms)[0]}


def rows_that_fill_geometry(config: dict) -> dict:
    """The launch of each alternative of ROWS_THAT_FILL for a build of `config`, and the choice:
    step 7.8's where its unsplit grid covers SPLIT_FILL of the SMs, else step 7.6's, each with its
    own key split."""
    one, two = geometry(config), ACROSS_HEADS.geometry(config)

    def choose(s: Shape, sms: int | None = None) -> tuple[int, int]:
        gx, gy, _ = two["at_split"](s, 1)["grid"]  # step 7.8's grid, unsplit
        which = 1 if gx * gy >= SPLIT_FILL * _sms(sms) else 0
        return which, (one, two)[which]["kv_split"](s, sms)

    return _two_launches(one, two, choose)


# Step 7.10: step 7.9 takes a grid as filling the GPU once it covers SPLIT_FILL of the SMs, as step
# 7.6's split rule does: it asks whether every SM gets a CTA, not how evenly. On the L4 at the mission
# shape step 7.6's 64 unsplit CTAs pass for 58 SMs, and 6 SMs then hold two CTAs while 52 hold one
# (step 7.9's page). This step's launcher weighs each launch it has by how evenly its CTAs spread over
# the SMs and takes the first, in the order below, within SPLIT_EFFICIENCY of the most even.
def even_split_geometry(config: dict, one_row: "LaterStep | None" = None, two_rows: "LaterStep" = ACROSS_HEADS) -> dict:
    """Step 7.9's two launches for a build of `config`: of step 7.8's unsplit and step 7.6's at each
    key split, in that order (two row blocks first, then fewer splits), the first whose CTAs spread
    over the SMs as evenly as SPLIT_EFFICIENCY of the most even's (choose_even_split). `one_row` and
    `two_rows`: the entries of the two launches (step 7.6's and step 7.8's without)."""
    one = geometry(config) if one_row is None else one_row.geometry(config)
    two = two_rows.geometry(config)

    def choose(s: Shape, sms: int | None = None) -> tuple[int, int]:
        options = [(1, 1)] + [(0, k) for k in splits_at(config, s.D)]  # (alternative, key split), preferred first

        def ctas(i: int) -> int:
            alternative, k = options[i]
            gx, gy, _ = (one, two)[alternative]["at_split"](s, k)["grid"]
            return gx * gy

        return options[choose_even_split(ctas, range(len(options)), _sms(sms))]

    return _two_launches(one, two, choose)


# Step 7.11: step 7.10 with less scalar work in every trip of the key-tile loop (WHOLE_TILES and
# SKIP_RESCALE): a K/V tile inside L is copied without a row test, from addresses whose per-thread part
# is worked out once, and a warp whose rows kept their maxima skips the rescale of O. Its two launches
# are steps 7.6 and 7.8 with both switches (07_mma_lean, 07_mma_lean_across_heads); the launcher is
# step 7.10's.
LEAN_LAUNCHES = ("07_mma_lean", "07_mma_lean_across_heads")


def lean_geometry(config: dict) -> dict:
    """Step 7.10's launcher over the lean-loop entries."""
    return even_split_geometry(config, LEAN, LEAN_ACROSS_HEADS)


# Step 7.12: step 7.11 without the vote (SKIP_RESCALE off again). ptxas schedules the rescale behind
# the vote's branch apart from the softmax it was interleaved with, so its instructions wait longer
# than the multiplies it skips save; the whole-tile copy stays.
WHOLE_TILE_LAUNCHES = ("07_mma_whole_tiles", "07_mma_whole_tiles_across_heads")


def whole_tile_geometry(config: dict) -> dict:
    """Step 7.10's launcher over the whole-tile-copy entries."""
    return even_split_geometry(config, WHOLE_TILES, WHOLE_TILES_ACROSS_HEADS)


# Step 7.13: step 7.12 with each tile's O += P V a tile later (DEFER_PV). At the large shapes on sm_90
# the model bounds steps 7.6-7.12 by the waits each warp's instructions leave, which a scheduler's
# warps take in turn: more warps per SM buy nothing there, more independent work inside a warp may.
# The MMAs of tile j-1's O += P V depend on nothing tile j's softmax computes, so they go between tile
# j's scores and its softmax, and ptxas may fill the softmax's waits with them (FlashAttention-3's
# intra-warpgroup overlap, here with mma.sync). The price: P of one tile held in registers (in fp32,
# rounded where those MMAs read it, where registers allow: one row block, and at D = 64 a key split;
# else in fp16) and V of one more tile held in shared memory (its stage is refilled a trip later).
# With two row blocks (D = 64) the held P takes ptxas to 255 registers and the model predicts a loss:
# the step keeps step 7.12's two-row entries there.
DEFERRED_PV_LAUNCHES = ("07_mma_deferred_pv", "07_mma_deferred_pv_across_heads")


def deferred_pv_geometry(config: dict) -> dict:
    """Step 7.10's launcher over the deferred O += P V entries."""
    return even_split_geometry(config, DEFERRED_PV, DEFERRED_PV_ACROSS_HEADS)


# The ablation 07_mma_two_rows_at_d128: at (2, 16, 4096, 128) the model bounds step 7.13 by its
# shared-memory traffic (step 7.13's page), and fewer bytes read per FLOP is what would move it. Two
# row blocks per warp at D = 128 read each K and V fragment once for both (step 7.7 at D = 64), and
# read Q's fragments from its tile at every k-step instead of keeping them (two blocks' accumulators
# leave no room for them): per 32 keys a row block reads 24 fragments where step 7.13's read 32. The
# two-row launch takes them with step 7.12's loop, as step 7.13's two-row launch does at D = 64
# (there the held P of DEFER_PV took ptxas to 255 registers and cost waits); the one-row launch is
# step 7.13's. The model predicts the waits then bound it above step 7.13 (step 7.13's page).
TWO_ROWS_D128_LAUNCHES = ("07_mma_deferred_pv", "07_mma_q_from_tile")


def two_rows_d128_geometry(config: dict) -> dict:
    """Step 7.10's launcher over step 7.13's one-row entries and the two-row entries of Q_FROM_TILE."""
    return even_split_geometry(config, DEFERRED_PV, Q_FROM_TILE)


for _kid, _geometry, _launches, _two_rows, _title, _summary in (
        ("07_mma_rows_that_fill", rows_that_fill_geometry, ROWS_THAT_FILL, ACROSS_HEADS,
         "two row blocks where they fill the GPU",
         "step 7.8 where its unsplit grid fills the GPU, step 7.6's launch (one row block, its key split) "
         "where it does not"),
        ("07_mma_even_split", even_split_geometry, ROWS_THAT_FILL, ACROSS_HEADS,
         "two row blocks where they fill the GPU, keys split evenly",
         "step 7.9's launches, step 7.8's or step 7.6's at a key split, whichever spreads its CTAs over the "
         "SMs most evenly (fewer splits and two row blocks first, within SPLIT_EFFICIENCY)"),
        ("07_mma_lean_loop", lean_geometry, LEAN_LAUNCHES, LEAN_ACROSS_HEADS, "lean key-tile loop",
         f"step 7.10's launches {LEAN_SUMMARY}"),
        ("07_mma_whole_tile_copy", whole_tile_geometry, WHOLE_TILE_LAUNCHES, WHOLE_TILES_ACROSS_HEADS,
         "whole-tile copy without the vote", f"step 7.10's launches {WHOLE_TILES_SUMMARY}"),
        ("07_mma_pv_a_tile_later", deferred_pv_geometry, DEFERRED_PV_LAUNCHES, DEFERRED_PV_ACROSS_HEADS,
         "O += P V a tile later", f"step 7.12's launches {DEFERRED_PV_SUMMARY}"),
        ("07_mma_two_rows_at_d128", two_rows_d128_geometry, TWO_ROWS_D128_LAUNCHES, Q_FROM_TILE,
         "two row blocks at D = 128", "ablation of step 7.13: its launches, the two-row one with two row blocks at "
         "D = 128 too (Q's fragments read from its tile at every k-step, step 7.12's loop)")):
    register(KernelSpec(
        id=_kid,
        title=f"Swizzle + double buffer, {_title}",
        entry=_two_rows.entries[64],
        entries_by_head_dim=_two_rows.entries,
        **_geometry(TUNING.defaults),
        **COMMON,
        tuning=variant_tuning(_geometry),
        alternatives=_launches,
        summary=_summary,
        conflict_free=("ldmatrix", "cp.async", "ld/st"),
        variant_of="07_mma",
    ))


@dataclass(frozen=True)
class Step:
    """One step of chapter 7's climb: the kernel that adds `technique` to the step before it."""
    number: str        # "7.1", ...: the page's number
    kernel_id: str
    technique: str     # what this step adds, as the page's title says it
    page: str          # the notebook under book/ (without .ipynb)
    # A step that changes the launcher, not the kernel: the function whose code is the change (its
    # kernel code is the step before's). None: the step is a template switch of the source.
    rule: Callable | None = None


# Chapter 7 in steps, each one template switch of kernels/07_mma_swizzle.cu away from the one before,
# or one launcher rule (attnlab.kernels.steps shows each step's code and its diff).
STEPS_07: tuple[Step, ...] = (
    Step("7.1", "07_mma_plain", "mma.sync, ldmatrix and P in registers", "ch07_1_mma"),
    Step("7.2", "07_mma_longest_first", "The longest query tiles first", "ch07_2_longest_first"),
    Step("7.3", "07_mma_single_buffer", "The XOR swizzle", "ch07_3_swizzle"),
    Step("7.4", "07_mma_two_barriers", "cp.async copies ahead of their use", "ch07_4_pipeline"),
    Step("7.5", "07_mma_nosplit", "One barrier per key tile", "ch07_5_one_barrier"),
    Step("7.6", "07_mma", "The keys split to fill the GPU", "ch07_6_key_split"),
    Step("7.7", "07_mma_two_row_blocks", "Two query row blocks per warp", "ch07_7_two_row_blocks"),
    Step("7.8", "07_mma_across_heads", "The longest query tiles first across the heads", "ch07_8_across_heads"),
    Step("7.9", "07_mma_rows_that_fill", "Two row blocks where they fill the GPU", "ch07_9_rows_that_fill",
         rule=rows_that_fill_geometry),
    Step("7.10", "07_mma_even_split", "The launch that spreads its CTAs most evenly", "ch07_10_even_split",
         rule=even_split_geometry),
    Step("7.11", "07_mma_lean_loop", "Less scalar work per key tile", "ch07_11_lean_loop"),
    Step("7.12", "07_mma_whole_tile_copy", "The whole-tile copy without the vote", "ch07_12_whole_tile_copy"),
    Step("7.13", "07_mma_pv_a_tile_later", "O += P V a tile later, under the softmax", "ch07_13_pv_a_tile_later"),
)
# The climb's parts, each named by the step it starts at: steps 7.1-7.6 build FlashAttention-2's
# schedule on mma.sync (and its key split); from step 7.7 on, the steps go past it. The overview's
# tables show one part each, so that none grows with every step.
PARTS_07: tuple[tuple[str, str], ...] = (
    ("7.1", "FlashAttention-2's schedule on mma.sync"),
    ("7.7", "Past FlashAttention-2's schedule"),
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
    **cta_split_geometry(TUNING.defaults),
    tuning=variant_tuning(cta_split_geometry, cta_split_tiles),
    **{**COMMON, "extra_sources": COMMON["extra_sources"] + ("../src/attnlab/kernels/split_ctas.py",)},
    runner="attnlab.gpu.launch:run_split_ctas",
    summary="ablation of 07_mma: FlashAttention-2's split, the keys cut across CTAs (grid z), fp32 partials "
            "in global memory merged by a second kernel",
    conflict_free=("ldmatrix", "cp.async", "ld/st"),
    variant_of="07_mma",
))
