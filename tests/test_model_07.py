"""A CPU model of kernels/07_mma_swizzle.cu, down to registers and shared-memory bytes.

The kernel cannot run here, so this file runs it in NumPy instead, one CTA at a time with its 4
warps x 32 lanes as array axes:

- the m16n8k16 A/B/C fragment layouts exactly as the PTX ISA gives them (element -> (row, col) for
  lane = 4 * groupID + threadID_in_group), and a simulated `mma.sync` that assembles the matrices
  from those fragments;
- `ldmatrix .x4` (and `.trans`) as the PTX ISA defines it: lanes 8i..8i+7 name the rows of matrix
  i, lane l receives row l/4, columns 2(l%4), 2(l%4)+1 (transposed: the other way round), read
  from a simulated shared-memory byte array at the addresses the kernel computes;
- shared memory laid out by the same swizzle (kernels/swizzle.cuh, mirrored below and checked
  against its text), filled by 16-byte cp.async copies that are in flight (NaN) until their
  commit group is waited for, with zero-fill past L;
- the kernel's loop: stages, prefetch (before the barrier with two barriers per tile, after it
  with one), the causal loop bound and per-warp skip, the mask, the quad shuffles (xor 1, 2), exp2
  with log2(e) in the scale (one fma per score, the sign of a negative scale moved onto Q), the
  fp16 repack of P as the A operand, the output staged through the Q tile and stored in 16-byte
  rows;
- the key split: warp groups that multiply disjoint slices of every key tile for the same rows,
  and the merge of their (m, l, O) through shared memory, lane by lane, into group 0;
- two 16-row blocks per warp (ROW_BLOCKS = 2, step 7.7), modelled as two virtual warps that read
  the same K and V fragments and share their warp's skip and mask decisions; and the causal grid
  whose CTA i takes query tile i / (B H) of head i % (B H) (ACROSS_HEADS, step 7.8).

Each index below is the kernel's formula written again, so an indexing bug in the kernel is a bug
here and fails the pass rule against the fp64 reference. The primitives are also tested alone
against direct matrix products, and a bank model checks the swizzle's claim (assuming, as the
kernel's __align__(128) asks, that the dynamic shared memory starts on a 128-byte boundary).

What a sequential model cannot show: races between warps (the barriers' placement is argued in
the kernel's comments; compute-sanitizer racecheck on a GPU is the test), and the hardware's own
accumulation order inside an MMA (fp32 here, which the pass rule's margin covers).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from attnlab.kernels import registry
from attnlab.pass_rule import judge, make_inputs
from attnlab.paths import kernels_dir
from attnlab.reference import naive_fp16, reference_attention
from attnlab.shapes import Shape

SRC = (kernels_dir() / "07_mma_swizzle.cu").read_text()
SWIZZLE_SRC = (kernels_dir() / "swizzle.cuh").read_text()


def _const(name: str) -> int:
    return int(re.search(rf"constexpr int {name} = (\d+);", SRC).group(1))


WARPS = _const("WARPS")
assert re.search(r"constexpr int THREADS = WARPS \* 32;", SRC)
assert re.search(r"constexpr int ROW_WARPS = WARPS / KV_SPLIT;", SRC)
assert re.search(r"constexpr int WARP_ROWS = 16 \* ROW_BLOCKS;", SRC)
assert re.search(r"constexpr int BLOCK_M = WARP_ROWS \* ROW_WARPS;", SRC)
assert "q_block = linear / gridDim.y;" in SRC and "bh = linear % gridDim.y;" in SRC
assert re.search(r"constexpr int SUB_N = BLOCK_N / KV_SPLIT;", SRC)
THREADS = WARPS * 32
BLOCK_M = WARPS * 16   # without a split
LOG2E = np.float32(re.search(r"constexpr float LOG2E = ([0-9.]+)f;", SRC).group(1))


@dataclass(frozen=True)
class Variant:
    entry: str
    D: int
    BLOCK_N: int
    kv_split: int
    swizzle: bool
    stages: int
    one_barrier: bool
    longest_first: bool
    row_blocks: int = 1
    across_heads: bool = False
    whole_tiles: bool = False   # the same arithmetic: a copy without row tests of rows inside L
    skip_rescale: bool = False  # the same arithmetic: a skipped rescale multiplies by exactly 1
    defer_pv: bool = False      # the same arithmetic: O's adds and rescales in the same order, a tile later

    @property
    def block_m(self) -> int:  # query rows per CTA: 16 per row block, row_blocks per warp of one group
        return 16 * self.row_blocks * (WARPS // self.kv_split)

    @property
    def smem_bytes(self) -> int:  # Q tile + stages x (K tile + V tile), as laid out in the kernel
        return 2 * self.D * (self.block_m + self.stages * 2 * self.BLOCK_N)


def _value(token: str) -> int:
    return int(token) if token.isdigit() else _const(token)


# The tiles other GPUs take where they differ from the source's: (D, keys per tile, stages) from
# registry.ch07_mma.arch_tiles (64 keys at D = 128 on sm_80 and sm_90; 3 stages at D = 64 and 128
# on sm_90).
ARCH_TILES = sorted({(D, tiles.get(f"ATTN07_BLOCK_N_D{D}", _const(f"BLOCK_N_D{D}")),
                      tiles.get(f"ATTN07_STAGES_D{D}", _const(f"STAGES_D{D}")))
                     for tiles in map(registry.ch07_mma.arch_tiles, ("sm_80", "sm_86", "sm_89", "sm_90"))
                     for D in (64, 128) if any(name.endswith(f"_D{D}") for name in tiles)})


def _variants() -> dict[str, Variant]:
    """Every ATTN07_ENTRY(name, D, BLOCK_N, KV_SPLIT, SWIZZLE, STAGES, ONE_BARRIER, LONGEST_FIRST, ROW_BLOCKS,
    ACROSS_HEADS, WHOLE_TILES, SKIP_RESCALE, DEFER_PV) of the source
    with its own tiles, and again as "name@BLOCK_N/STAGES" with each other architecture's tiles at
    its D (an entry with a fixed number of stages keeps it). A split whose slice of the tile is not
    whole 16-key steps compiles to nothing and is left out."""
    out = {}
    for m in re.finditer(r"^ATTN07_ENTRY\((attn_fwd_07_\w+), (\d+), (\w+), (\d+), (true|false), (\w+), "
                         r"(true|false), (true|false), ([12]), (true|false), (true|false), (true|false), (true|false)\)$",
                         SRC, re.M):
        name, d, bn, split, sw, st, ob, lf, rb, across, whole, skip, defer = m.groups()
        tiles = [(_value(bn), _value(st))] + [(t, s if not st.isdigit() else int(st))
                                              for D, t, s in ARCH_TILES if D == int(d)]
        for i, (tile, stages) in enumerate(dict.fromkeys(tiles)):
            if (tile // int(split)) % 16 == 0:
                label = name if i == 0 else f"{name}@{tile}/{stages}"
                out[label] = Variant(name, int(d), tile, int(split), sw == "true", stages, ob == "true",
                                     lf == "true", int(rb), across == "true", whole == "true",
                                     skip == "true", defer == "true")
    return out


VARIANTS = _variants()
assert len({v.entry for v in VARIANTS.values()}) == SRC.count("\nATTN07_ENTRY(") >= 12
assert ARCH_TILES == [(64, 64, 3), (128, 64, 2), (128, 64, 3)]
assert {"attn_fwd_07_mma_split4_d128@64/2", "attn_fwd_07_mma_d128@64/3", "attn_fwd_07_mma_d64@64/3"} <= set(VARIANTS)
MAIN = {64: VARIANTS["attn_fwd_07_mma_d64"], 128: VARIANTS["attn_fwd_07_mma_d128"]}
MAIN_64_KEYS = VARIANTS["attn_fwd_07_mma_d128@64/2"]  # D = 128 on sm_80 (and sm_90 with 3 stages)
SPLITS = {e: var for e, var in VARIANTS.items() if var.kv_split > 1}
F16, F32 = np.float16, np.float32
NEG_INF = F32(-np.inf)

# ---- kernels/swizzle.cuh, written again --------------------------------------------------------


def tile_offset(row, chunk, row_bytes: int, swizzle: bool):
    """attn::tile_offset<ROW_BYTES, SWIZZLE>: byte offset of 16-byte chunk `chunk` of `row`."""
    assert row_bytes % 128 == 0
    return row * row_bytes + (((chunk ^ (row & 7)) if swizzle else chunk) << 4)


def ldsm_row(lane):
    return lane & 15


def ldsm_chunk(lane):
    return lane >> 4


def ldsm_row_b(lane):
    return (lane & 7) + ((lane >> 4) << 3)


def ldsm_chunk_b(lane):
    return (lane >> 3) & 1


def test_swizzle_header_is_the_formula_modelled_here():
    flat = " ".join(SWIZZLE_SRC.split())
    assert "return row * ROW_BYTES + ((SWIZZLE ? (chunk ^ (row & 7)) : chunk) << 4);" in flat
    assert "ldsm_row(int lane) { return lane & 15; }" in flat
    assert "ldsm_chunk(int lane) { return lane >> 4; }" in flat
    assert "ldsm_row_b(int lane) { return (lane & 7) + ((lane >> 4) << 3); }" in flat
    assert "ldsm_chunk_b(int lane) { return (lane >> 3) & 1; }" in flat


# ---- PTX fragment layouts (mma.m16n8k16, .f16 inputs, .f32 accumulators) --------------------

LANE = np.arange(32)


def _ptx_a_map():
    """A (16x16, row): a0..a7 in four .f16x2 registers, low half first."""
    rows, cols = np.empty((32, 8), int), np.empty((32, 8), int)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(8):
            rows[lane, i] = group if (0 <= i < 2 or 4 <= i < 6) else group + 8
            cols[lane, i] = tig * 2 + (i & 1) + (8 if i >= 4 else 0)
    return rows.reshape(32, 4, 2), cols.reshape(32, 4, 2)


def _ptx_b_map():
    """B (16x8, col): b0..b3 in two .f16x2 registers."""
    rows, cols = np.empty((32, 4), int), np.empty((32, 4), int)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(4):
            rows[lane, i] = tig * 2 + (i & 1) + (8 if i >= 2 else 0)
            cols[lane, i] = group
    return rows.reshape(32, 2, 2), cols.reshape(32, 2, 2)


def _ptx_c_map():
    """C/D (16x8, f32): c0..c3."""
    rows, cols = np.empty((32, 4), int), np.empty((32, 4), int)
    for lane in range(32):
        group, tig = lane >> 2, lane % 4
        for i in range(4):
            rows[lane, i] = group if i < 2 else group + 8
            cols[lane, i] = tig * 2 + (i & 1)
    return rows, cols


A_ROW, A_COL = _ptx_a_map()
B_ROW, B_COL = _ptx_b_map()
C_ROW, C_COL = _ptx_c_map()


def mma_16816(d, a, b0, b1):
    """d + A @ B from fragments: d [..., 32, 4] f32, a [..., 32, 4, 2] f16, b0/b1 [..., 32, 2] f16."""
    batch = d.shape[:-2]
    A = np.zeros(batch + (16, 16), F32)
    B = np.zeros(batch + (16, 8), F32)
    C = np.zeros(batch + (16, 8), F32)
    A[..., A_ROW, A_COL] = a
    B[..., B_ROW, B_COL] = np.stack([b0, b1], axis=-2)
    C[..., C_ROW, C_COL] = d
    return (np.matmul(A, B) + C).astype(F32)[..., C_ROW, C_COL]


def ldmatrix_x4(smem, addr, trans=False):
    """ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: addr [..., 32] byte addresses (one row of
    8 halves each); returns the 4 registers of every lane as [..., 32, 4, 2] halves."""
    addr = np.asarray(addr)
    assert (addr % 16 == 0).all() and (addr >= 0).all() and (addr + 16 <= 2 * smem.size).all()
    rows = smem[addr[..., None] // 2 + np.arange(8)]               # [..., 32 lanes, 8 halves]
    mats = rows.reshape(addr.shape[:-1] + (4, 8, 8))             # [..., matrix, row, col]
    e = np.arange(2)
    if trans:
        r, c = 2 * (LANE[:, None] % 4) + e, np.broadcast_to(LANE[:, None] // 4, (32, 2))
    else:
        r, c = np.broadcast_to(LANE[:, None] // 4, (32, 2)), 2 * (LANE[:, None] % 4) + e
    return np.moveaxis(mats[..., :, r, c], -3, -2)               # [..., 32, 4, 2]


def shfl_xor(x, mask):
    """__shfl_xor_sync(0xffffffff, x, mask) along the lane axis (the last one)."""
    return x[..., LANE ^ mask]


def pack_half2(lo, hi):
    """__floats2half2_rn: round to nearest even, lo in the low half."""
    return np.stack([lo, hi], axis=-1).astype(F16)


def exp2(x):
    return np.exp2(x, dtype=F32)


def fma(a, b, c):
    """fmaf: a * b + c with one rounding (float64 holds the fp32 product exactly)."""
    with np.errstate(invalid="ignore"):
        out = (np.float64(1) * a * np.float64(b) + c).astype(F32)
    return np.where(np.isneginf(a) & (b > 0), NEG_INF, out)


class SharedMemory:
    """The CTA's dynamic shared memory as halves, and cp.async 16-byte copies in commit groups.
    A copy in flight reads as NaN until `wait` lands its group; `src_bytes = 0` lands zeros."""

    def __init__(self, nbytes: int):
        self.halves = np.full(nbytes // 2, np.nan, F16)  # never-written memory is NaN too
        self.open: list = []
        self.groups: list = []

    def cp_async_16(self, dst, src_rows, valid):
        dst = np.asarray(dst).ravel()
        assert (dst % 16 == 0).all() and (dst + 16 <= 2 * self.halves.size).all()
        idx = dst[:, None] // 2 + np.arange(8)
        data = np.where(valid.ravel()[:, None], src_rows.reshape(-1, 8), F16(0))
        self.halves[idx] = np.nan
        self.open.append((idx, data))

    def commit(self):
        self.groups.append(self.open)
        self.open = []

    def wait(self, pending: int):
        while len(self.groups) > pending:
            for idx, data in self.groups.pop(0):
                self.halves[idx] = data


# ---- the kernel, one CTA at a time -------------------------------------------------------------

TID = np.arange(THREADS)
WARP = np.arange(WARPS)[:, None]   # [W, 1] against LANE's [32]
G, T = LANE >> 2, LANE & 3


def load_tile(sm: SharedMemory, tile: int, head, row0: int, L: int, D: int, rows: int, swizzle: bool):
    chunks = D // 8
    assert (rows * chunks) % THREADS == 0
    for i in range(rows * chunks // THREADS):
        idx = i * THREADS + TID
        r, c = idx // chunks, idx % chunks
        row = row0 + r
        valid = row < L
        src_row = np.where(valid, row, 0)
        src = head[src_row[:, None], c[:, None] * 8 + np.arange(8)]
        sm.cp_async_16(tile + tile_offset(r, c, 2 * D, swizzle), src, valid)


def run_cta(var: Variant, q, k, v, out, L: int, scale: float, causal: bool, bx: int, grid_x: int):
    """One CTA of one head, bx its query tile before the causal countdown (blockIdx.x, or the tile the
    interleaved grid of ACROSS_HEADS gives it): q, k, v fp16 [L, D]; writes rows of out. A warp of RB
    row blocks is RB virtual warps here (axis 0: warp w's block mb at w * RB + mb)."""
    D, BN, SW, BM, RB = var.D, var.BLOCK_N, var.swizzle, var.block_m, var.row_blocks
    row_warps, sub_n = WARPS // var.kv_split, BN // var.kv_split
    ROW_BYTES, K_STEPS, S_BLOCKS, P_STEPS, O_BLOCKS = 2 * D, D // 16, sub_n // 8, sub_n // 16, D // 8
    Q_BYTES, KV_BYTES = BM * ROW_BYTES, BN * ROW_BYTES
    NV, VW = WARPS * RB, np.arange(WARPS * RB)[:, None]              # virtual warps, [NV, 1]
    warp, mb = VW // RB, VW % RB
    group, row_warp = warp // row_warps, warp % row_warps             # [NV, 1]
    key0 = group * sub_n
    sm = SharedMemory(var.smem_bytes)
    q_tile = 0
    k_tile = lambda st: q_tile + Q_BYTES + st * 2 * KV_BYTES
    v_tile = lambda st: q_tile + Q_BYTES + st * 2 * KV_BYTES + KV_BYTES

    q_block = grid_x - 1 - bx if causal and var.longest_first else bx
    q0 = q_block * BM
    warp_row0 = q0 + row_warp * 16 * RB                              # [NV, 1]: the real warp's first row
    block_row0 = warp_row0 + 16 * mb                                 # [NV, 1]: this row block's
    kv_end = min(L, q0 + BM) if causal else L
    n_tiles = -(-kv_end // BN)

    S = var.stages
    load_tile(sm, q_tile, q, q0, L, D, BM, SW)
    for p in range(S - 1):  # the first S - 1 tiles, one group each (committed even past the last)
        if p < n_tiles:
            load_tile(sm, k_tile(p), k, p * BN, L, D, BN, SW)
            load_tile(sm, v_tile(p), v, p * BN, L, D, BN, SW)
        sm.commit()

    o_acc = np.zeros((NV, 32, O_BLOCKS, 4), F32)
    m_run = np.full((NV, 32, 2), NEG_INF, F32)
    l_run = np.zeros((NV, 32, 2), F32)
    scale_log2 = np.fmax(np.abs(F32(scale)) * LOG2E, np.finfo(F32).tiny)
    key_limit = [np.minimum(L - 1, block_row0 + G + 8 * h) if causal else np.full((NV, 32), L - 1)
                 for h in range(2)]
    q_frag = None
    for j in range(n_tiles):
        stage, nxt = j % S, j + S - 1
        nxt_stage = S - 1 if stage == 0 else stage - 1                # tile j-1's
        if var.one_barrier:  # wait, (barrier,) then refill the stage of tile j-1
            sm.wait(S - 2)
        if nxt < n_tiles:
            load_tile(sm, k_tile(nxt_stage), k, nxt * BN, L, D, BN, SW)
            load_tile(sm, v_tile(nxt_stage), v, nxt * BN, L, D, BN, SW)
        sm.commit()
        if not var.one_barrier:  # two barriers: (the copy was issued first,) wait, barrier
            sm.wait(S - 1)
        if j == 0:
            q_frag = [ldmatrix_x4(sm.halves, q_tile + tile_offset(row_warp * 16 * RB + 16 * mb + ldsm_row(LANE),
                                                                  2 * ks + ldsm_chunk(LANE), ROW_BYTES, SW))
                      for ks in range(K_STEPS)]
            if scale < 0:
                q_frag = [-qf for qf in q_frag]  # the sign-bit flip: exact negation of fp16
        k0 = j * BN + key0                                           # [NV, 1]
        active = (not causal) | (k0 <= warp_row0 + 16 * RB - 1)       # [NV, 1]: the (real) warp's skip

        s = np.zeros((NV, 32, S_BLOCKS, 4), F32)
        for np_ in range(S_BLOCKS // 2):
            for ks in range(K_STEPS):
                kf = ldmatrix_x4(sm.halves, k_tile(stage) + tile_offset(key0 + 16 * np_ + ldsm_row_b(LANE),
                                                                       2 * ks + ldsm_chunk_b(LANE), ROW_BYTES, SW))
                s[:, :, 2 * np_] = mma_16816(s[:, :, 2 * np_], q_frag[ks], kf[..., 0, :], kf[..., 1, :])
                s[:, :, 2 * np_ + 1] = mma_16816(s[:, :, 2 * np_ + 1], q_frag[ks], kf[..., 2, :], kf[..., 3, :])

        need_mask = (k0 + sub_n > L) | (causal & (k0 + sub_n - 1 > warp_row0))   # [NV, 1], the real warp's
        for nb in range(S_BLOCKS):
            for e in range(4):
                masked = need_mask & (k0 + nb * 8 + 2 * T + (e & 1) > key_limit[e >> 1])
                s[:, :, nb, e] = np.where(masked, NEG_INF, s[:, :, nb, e])

        neg_mc = np.empty((NV, 32, 2), F32)
        o_new, m_new_run, l_new = o_acc.copy(), m_run.copy(), l_run.copy()
        for h in range(2):
            mx = np.full((NV, 32), NEG_INF, F32)
            for nb in range(S_BLOCKS):
                mx = np.fmax(mx, np.fmax(s[:, :, nb, 2 * h], s[:, :, nb, 2 * h + 1]))
            mx = np.fmax(mx, shfl_xor(mx, 1))
            mx = np.fmax(mx, shfl_xor(mx, 2))
            m_new = np.fmax(m_run[..., h], mx)
            m_use = np.where(m_new == NEG_INF, F32(0), m_new)
            neg_mc[..., h] = -m_use * scale_log2
            with np.errstate(invalid="raise"):
                corr = exp2((m_run[..., h] - m_use) * scale_log2)
            m_new_run[..., h] = m_new
            l_new[..., h] = l_run[..., h] * corr
            o_new[:, :, :, 2 * h] *= corr[..., None]
            o_new[:, :, :, 2 * h + 1] *= corr[..., None]
        for nb in range(S_BLOCKS):
            for e in range(4):
                with np.errstate(invalid="raise"):
                    s[:, :, nb, e] = exp2(fma(s[:, :, nb, e], scale_log2, neg_mc[..., e >> 1]))
                l_new[..., e >> 1] += s[:, :, nb, e]

        for kp in range(P_STEPS):
            pa = np.stack([pack_half2(s[:, :, 2 * kp, 0], s[:, :, 2 * kp, 1]),
                           pack_half2(s[:, :, 2 * kp, 2], s[:, :, 2 * kp, 3]),
                           pack_half2(s[:, :, 2 * kp + 1, 0], s[:, :, 2 * kp + 1, 1]),
                           pack_half2(s[:, :, 2 * kp + 1, 2], s[:, :, 2 * kp + 1, 3])], axis=-2)
            for dp in range(D // 16):
                vf = ldmatrix_x4(sm.halves, v_tile(stage) + tile_offset(key0 + 16 * kp + ldsm_row(LANE),
                                                                       2 * dp + ldsm_chunk(LANE), ROW_BYTES, SW),
                                 trans=True)
                o_new[:, :, 2 * dp] = mma_16816(o_new[:, :, 2 * dp], pa, vf[..., 0, :], vf[..., 1, :])
                o_new[:, :, 2 * dp + 1] = mma_16816(o_new[:, :, 2 * dp + 1], pa, vf[..., 2, :], vf[..., 3, :])

        act = active[:, :, None]                                    # skipped warps keep their state
        o_acc = np.where(act[..., None], o_new, o_acc)
        m_run = np.where(act, m_new_run, m_run)
        l_run = np.where(act, l_new, l_run)

    if var.kv_split > 1:
        # The merge: warp (0, rw) folds in warp (g, rw)'s state, g = 1, 2, ..., lane by lane (the
        # same lane of both holds the same elements), with the online softmax's rescaling.
        for other in range(1, var.kv_split):
            for rw, m in ((rw, m) for rw in range(row_warps) for m in range(RB)):
                a, b = rw * RB + m, (other * row_warps + rw) * RB + m  # (virtual) warps of group 0 and `other`
                for h in range(2):
                    m_run[a, :, h], l_run[a, :, h], o_acc[a, :, :, 2 * h:2 * h + 2] = merge_row(
                        m_run[a, :, h], l_run[a, :, h], o_acc[a, :, :, 2 * h:2 * h + 2],
                        m_run[b, :, h], l_run[b, :, h], o_acc[b, :, :, 2 * h:2 * h + 2], F32(scale_log2))
    finishing = (group == 0)[:, 0]                                  # the warps that store rows

    # Epilogue: quad sums, O / l to fp16 through this warp's rows of the Q tile, 16-byte stores.
    inv_l = np.empty((NV, 32, 2), F32)
    for h in range(2):
        l = l_run[..., h]
        l = l + shfl_xor(l, 1)
        l = l + shfl_xor(l, 2)
        inv_l[..., h] = np.where(l > 0, F32(1) / np.where(l > 0, l, 1), F32(0))
    for nb in range(O_BLOCKS):
        for h in range(2):
            off = tile_offset(row_warp * 16 * RB + 16 * mb + G + 8 * h, nb, ROW_BYTES, SW) + 4 * T   # [NV, 32]
            val = pack_half2(o_acc[:, :, nb, 2 * h] * inv_l[..., h], o_acc[:, :, nb, 2 * h + 1] * inv_l[..., h])
            sm.halves[off[finishing][..., None] // 2 + np.arange(2)] = val[finishing]
    chunks = D // 8
    for i in range(16 * chunks // 32):  # each row block's 16 rows (the warp's loop takes its RB blocks in turn)
        idx = i * 32 + LANE
        r, c = idx // chunks, idx % chunks
        row = block_row0 + r                                                      # [NV, 32]
        src = tile_offset(row_warp * 16 * RB + 16 * mb + r, c, ROW_BYTES, SW)
        data = sm.halves[src[..., None] // 2 + np.arange(8)]
        ok = (row < L) & finishing[:, None]
        out[row[ok][:, None], (np.broadcast_to(c, row.shape)[ok] * 8)[:, None] + np.arange(8)] = data[ok]


def merge_row(m_a, l_a, o_a, m_b, l_b, o_b, scale_log2):
    """The kernel's merge of one row's partial state b into a (per lane: m, l [32], O [32, ...])."""
    m_new = np.fmax(m_a, m_b)
    m_use = np.where(m_new == NEG_INF, F32(0), m_new)
    with np.errstate(invalid="raise"):
        c_self = exp2((m_a - m_use) * scale_log2)
        c_other = exp2((m_b - m_use) * scale_log2)
    o = o_a * c_self[:, None, None] + o_b * c_other[:, None, None]
    return m_new, l_a * c_self + l_b * c_other, o


def model_attention(var_or_entry, q, k, v, causal: bool, scale: float | None = None):
    """attention [B, H, L, D] through the model; out starts as NaN (the suite's poison)."""
    var = VARIANTS[var_or_entry] if isinstance(var_or_entry, str) else var_or_entry
    B, H, L, D = q.shape
    assert D == var.D
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    qn, kn, vn = (t.numpy().astype(F16).reshape(B * H, L, D) for t in (q, k, v))
    out = np.full((B * H, L, D), np.nan, F16)
    grid_x = -(-L // var.block_m)
    for by in range(B * H):
        for bx in range(grid_x):
            tile, bh = bx, by
            if var.across_heads and causal:  # CTA i (x fastest) takes tile i / (B H) of pair i % (B H)
                linear = by * grid_x + bx
                tile, bh = linear // (B * H), linear % (B * H)
            run_cta(var, qn[bh], kn[bh], vn[bh], out[bh], L, scale, causal, tile, grid_x)
    return torch.from_numpy(out.reshape(B, H, L, D))


# ---- the primitives against direct matrix products ---------------------------------------------

RNG = np.random.default_rng(7)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(F16)


def test_fragment_maps_are_bijections():
    for rows, cols, shape in ((A_ROW, A_COL, (16, 16)), (B_ROW, B_COL, (16, 8)), (C_ROW, C_COL, (16, 8))):
        cells = rows.ravel() * shape[1] + cols.ravel()
        assert sorted(cells) == list(range(shape[0] * shape[1]))


def test_mma_of_fragments_is_the_matrix_product():
    A, B, C = _rand(3, 16, 16), _rand(3, 16, 8), RNG.standard_normal((3, 16, 8)).astype(F32)
    d = mma_16816(C[:, C_ROW, C_COL], A[:, A_ROW, A_COL], B[:, B_ROW[:, 0], B_COL[:, 0]],
                  B[:, B_ROW[:, 1], B_COL[:, 1]])
    D = np.zeros_like(C)
    D[:, C_ROW, C_COL] = d
    np.testing.assert_allclose(D, A.astype(np.float64) @ B.astype(np.float64) + C, rtol=1e-5, atol=1e-5)


def _tile_in_smem(M, swizzle):
    """A row-major fp16 matrix [rows, D] stored as the kernel stores tiles."""
    rows, D = M.shape
    sm = SharedMemory(rows * D * 2)
    r, c = np.meshgrid(np.arange(rows), np.arange(D // 8), indexing="ij")
    sm.cp_async_16(tile_offset(r, c, 2 * D, swizzle), M.reshape(rows, D // 8, 8), np.ones(r.shape, bool))
    sm.commit()
    sm.wait(0)
    return sm.halves


@pytest.mark.parametrize("swizzle", [True, False])
@pytest.mark.parametrize("D", [64, 128])
def test_ldmatrix_gives_the_kernels_fragments(swizzle, D):
    """Q as A operands, K as B operands of S = Q K^T, V (.trans) as B operands of O = P V:
    the registers the kernel's addresses produce are the PTX fragments of the intended blocks."""
    Q, K, V = _rand(64, D), _rand(32, D), _rand(32, D)
    q_s, k_s, v_s = (_tile_in_smem(M, swizzle) for M in (Q, K, V))
    for warp in range(WARPS):
        for ks in range(D // 16):
            qf = ldmatrix_x4(q_s, tile_offset(warp * 16 + ldsm_row(LANE), 2 * ks + ldsm_chunk(LANE), 2 * D, swizzle))
            np.testing.assert_array_equal(qf, Q[warp * 16:warp * 16 + 16, 16 * ks:16 * ks + 16][A_ROW, A_COL])
    KT = K.T                                                    # B of S = Q K^T is K^T [D, keys]
    for np_ in range(2):
        for ks in range(D // 16):
            kf = ldmatrix_x4(k_s, tile_offset(16 * np_ + ldsm_row_b(LANE), 2 * ks + ldsm_chunk_b(LANE), 2 * D,
                                              swizzle))
            for pair, nb in ((0, 2 * np_), (2, 2 * np_ + 1)):
                blk = KT[16 * ks:16 * ks + 16, 8 * nb:8 * nb + 8]
                np.testing.assert_array_equal(kf[:, pair], blk[B_ROW[:, 0], B_COL[:, 0]])      # b0
                np.testing.assert_array_equal(kf[:, pair + 1], blk[B_ROW[:, 1], B_COL[:, 1]])  # b1
    for kp in range(2):
        for dp in range(D // 16):
            vf = ldmatrix_x4(v_s, tile_offset(16 * kp + ldsm_row(LANE), 2 * dp + ldsm_chunk(LANE), 2 * D, swizzle),
                             trans=True)
            for pair, nb in ((0, 2 * dp), (2, 2 * dp + 1)):
                blk = V[16 * kp:16 * kp + 16, 8 * nb:8 * nb + 8]
                np.testing.assert_array_equal(vf[:, pair], blk[B_ROW[:, 0], B_COL[:, 0]])
                np.testing.assert_array_equal(vf[:, pair + 1], blk[B_ROW[:, 1], B_COL[:, 1]])


def test_warp_tile_products_through_the_kernels_loops():
    """S = Q K^T over the kernel's (np, ks) loop and O = P V over its (kp, dp) loop, P repacked from
    the S accumulators: equal to the matrix products."""
    D, BN = 64, 64
    Q, K, V = _rand(16, D), _rand(BN, D), _rand(BN, D)
    q_s, k_s, v_s = (_tile_in_smem(M, True) for M in (Q, K, V))
    s = np.zeros((32, BN // 8, 4), F32)
    for np_ in range(BN // 16):
        for ks in range(D // 16):
            qf = ldmatrix_x4(q_s, tile_offset(ldsm_row(LANE), 2 * ks + ldsm_chunk(LANE), 2 * D, True))
            kf = ldmatrix_x4(k_s, tile_offset(16 * np_ + ldsm_row_b(LANE), 2 * ks + ldsm_chunk_b(LANE), 2 * D, True))
            s[:, 2 * np_] = mma_16816(s[:, 2 * np_], qf, kf[:, 0], kf[:, 1])
            s[:, 2 * np_ + 1] = mma_16816(s[:, 2 * np_ + 1], qf, kf[:, 2], kf[:, 3])
    S = np.zeros((16, BN), F32)
    for nb in range(BN // 8):
        S[C_ROW, 8 * nb + C_COL] = s[:, nb]
    np.testing.assert_allclose(S, Q.astype(np.float64) @ K.T.astype(np.float64), rtol=1e-5, atol=1e-4)

    P = RNG.random((16, BN)).astype(F32)                        # any fp32 "probabilities" in C layout
    for nb in range(BN // 8):
        s[:, nb] = P[C_ROW, 8 * nb + C_COL]
    o = np.zeros((32, D // 8, 4), F32)
    for kp in range(BN // 16):
        pa = np.stack([pack_half2(s[:, 2 * kp, 0], s[:, 2 * kp, 1]), pack_half2(s[:, 2 * kp, 2], s[:, 2 * kp, 3]),
                       pack_half2(s[:, 2 * kp + 1, 0], s[:, 2 * kp + 1, 1]),
                       pack_half2(s[:, 2 * kp + 1, 2], s[:, 2 * kp + 1, 3])], axis=-2)
        np.testing.assert_array_equal(pa, P[:, 16 * kp:16 * kp + 16].astype(F16)[A_ROW, A_COL])  # the repack
        for dp in range(D // 16):
            vf = ldmatrix_x4(v_s, tile_offset(16 * kp + ldsm_row(LANE), 2 * dp + ldsm_chunk(LANE), 2 * D, True),
                             trans=True)
            o[:, 2 * dp] = mma_16816(o[:, 2 * dp], pa, vf[:, 0], vf[:, 1])
            o[:, 2 * dp + 1] = mma_16816(o[:, 2 * dp + 1], pa, vf[:, 2], vf[:, 3])
    O = np.zeros((16, D), F32)
    for nb in range(D // 8):
        O[C_ROW, 8 * nb + C_COL] = o[:, nb]
    np.testing.assert_allclose(O, P.astype(F16).astype(np.float64) @ V.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_quad_shuffle_reduces_each_row_and_nothing_else():
    """xor 1 and xor 2 combine exactly the 4 lanes holding one accumulator row; a full-warp
    butterfly (the seed study's bug) would mix 8 rows."""
    S = RNG.standard_normal((16, 64)).astype(F32)
    s = np.stack([S[C_ROW, 8 * nb + C_COL] for nb in range(8)], axis=1)   # [32, 8, 4]
    for h in range(2):
        mx = np.max(s[:, :, 2 * h:2 * h + 2], axis=(1, 2))
        mx = np.fmax(mx, shfl_xor(mx, 1))
        mx = np.fmax(mx, shfl_xor(mx, 2))
        np.testing.assert_array_equal(mx, S.max(axis=1)[G + 8 * h])
        wrong = mx
        for off in (4, 8, 16):
            wrong = np.fmax(wrong, shfl_xor(wrong, off))
        assert not np.array_equal(wrong, S.max(axis=1)[G + 8 * h])


def test_online_softmax_step_survives_a_fully_masked_row():
    """The kernel's update for a row whose every key so far is masked (m = -inf): no NaN, no
    weight, and the next tile with a visible key starts the row cleanly. (Tile 0 always shows
    every row a key, so the full runs above never take this path; the guard is for safety.)"""
    c = np.fmax(np.abs(F32(0.125)) * LOG2E, np.finfo(F32).tiny)
    m_run, l_run, o = NEG_INF, F32(0), F32(0)
    for s in (np.full(8, NEG_INF, F32), np.array([1.0, -2.0] + [-np.inf] * 6, F32)):
        m_new = np.fmax(m_run, s.max())
        m_use = F32(0) if m_new == NEG_INF else m_new
        with np.errstate(invalid="raise"):
            corr = exp2((m_run - m_use) * c)
            p = exp2(fma(s, c, -m_use * c))
        l_run, o, m_run = l_run * corr + p.sum(), o * corr + p.sum() * 3, m_new
        assert np.isfinite([corr, l_run, o]).all() and np.isfinite(p).all()
    assert np.isclose(o / l_run, 3) and np.isclose(l_run, 1 + np.exp(-3 * 0.125))


# ---- the whole kernel against the fp64 reference -----------------------------------------------


def _check(var, shape, causal, seed=0, scale=None):
    q, k, v = make_inputs(shape, seed=seed, device="cpu")
    ref = reference_attention(q, k, v, causal, scale)
    fp16_err = float((naive_fp16(q, k, v, causal, scale).double() - ref).abs().max())
    out = model_attention(var, q, k, v, causal, scale)
    verdict = judge(out, ref, fp16_err)
    assert verdict.passed, (f"{var.entry} ({var.BLOCK_N}-key tiles, {var.stages} stages) {shape.label()} "
                            f"causal={causal}: {verdict.reason}")
    return verdict


MODEL_SHAPES = [Shape(1, 1, 64, 64), Shape(1, 2, 17, 64), Shape(1, 1, 200, 128), Shape(1, 2, 333, 64),
                Shape(1, 2, 1, 64), Shape(1, 1, 1, 128)]


@pytest.mark.parametrize("shape", MODEL_SHAPES, ids=lambda s: s.label())
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_model_meets_pass_rule(shape, causal):
    # with the source's tiles and each other architecture's (64 keys at D = 128, three stages)
    tiles = [var for var in VARIANTS.values() if var.entry == MAIN[shape.D].entry]
    assert len(tiles) == {64: 2, 128: 3}[shape.D] and MAIN_64_KEYS in VARIANTS.values()
    for var in tiles:
        _check(var, shape, causal)


ABLATION_CASES = [(e, Shape(1, 1, 150, 64) if VARIANTS[e].D == 64 else Shape(1, 1, 200, 128))
                  for e in sorted(VARIANTS) if "_mma_d" not in e and e not in SPLITS]
# The interleaved causal grid over several heads and a tail tile: every (tile, head) once.
ABLATION_CASES += [(e, Shape(2, 3, 150, 64) if VARIANTS[e].D == 64 else Shape(1, 3, 100, 128))
                   for e in sorted(VARIANTS) if VARIANTS[e].across_heads and e not in SPLITS]


@pytest.mark.parametrize("entry,shape", ABLATION_CASES, ids=[e for e, _ in ABLATION_CASES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ablations_compute_the_same_attention(entry, shape, causal):
    _check(VARIANTS[entry], shape, causal)


# Every key split against the fp64 reference: lengths below, at and past a tile, causal and not.
SPLIT_CASES = [(e, Shape(1, 2, L, var.D)) for e, var in sorted(SPLITS.items()) for L in (1, 17, 64, 129, 333)]


@pytest.mark.parametrize("entry,shape", SPLIT_CASES, ids=[f"{e}-{s.L}" for e, s in SPLIT_CASES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_key_split_merges_to_the_reference(entry, shape, causal):
    _check(VARIANTS[entry], shape, causal)


def test_the_merge_is_what_the_split_needs():
    """Without the rescaling of each group to the common max, the split's answer is wrong: the
    model's merge is load-bearing, not a formality."""
    global merge_row
    real = merge_row
    try:  # the groups' sums and outputs added as they are, each against its own max
        merge_row = lambda m_a, l_a, o_a, m_b, l_b, o_b, c: (np.fmax(m_a, m_b), l_a + l_b, o_a + o_b)  # noqa: E731
        q, k, v = make_inputs(Shape(1, 1, 129, 64), seed=0, device="cpu")
        ref = reference_attention(q, k, v)
        fp16_err = float((naive_fp16(q, k, v).double() - ref).abs().max())
        split = model_attention(SPLITS["attn_fwd_07_mma_split2_d64"], q, k, v, False)
        assert not judge(split, ref, fp16_err).passed
    finally:
        merge_row = real
    assert judge(model_attention(SPLITS["attn_fwd_07_mma_split2_d64"], q, k, v, False), ref, fp16_err).passed


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_any_finite_scale_even_negative_or_zero(scale):
    _check(MAIN[64], Shape(1, 1, 70, 64), causal=True, scale=scale)


def test_model_catches_a_wrong_layout():
    """The model is sharp: swap the K fragment halves (b0 <-> b1) and the pass rule fails."""
    global mma_16816
    real = mma_16816
    try:
        mma_16816 = lambda d, a, b0, b1: real(d, a, b1, b0)  # noqa: E731
        q, k, v = make_inputs(Shape(1, 1, 64, 64), seed=0, device="cpu")
        ref = reference_attention(q, k, v)
        fp16_err = float((naive_fp16(q, k, v).double() - ref).abs().max())
        assert not judge(model_attention(MAIN[64], q, k, v, False), ref, fp16_err).passed
    finally:
        mma_16816 = real


# ---- shared-memory banks: what the swizzle buys ------------------------------------------------


def _banks(addr, width):
    """The 4-byte banks (of 32) touched by accesses of `width` bytes at byte addresses `addr`."""
    return (np.asarray(addr)[..., None] // 4 + np.arange(width // 4)) % 32


def _wavefronts(addr, width):
    """Shared-memory wavefronts one warp-wide access needs: 16-byte accesses go a quarter-warp
    (8 lanes, one ldmatrix matrix) at a time, 4-byte ones all 32 lanes at once; within a phase
    the count is the worst bank's number of distinct 4-byte words."""
    lanes_per_phase = 128 // width
    total = 0
    for p in range(32 // lanes_per_phase):
        a = np.asarray(addr)[p * lanes_per_phase:(p + 1) * lanes_per_phase]
        words = np.unique((a[:, None] // 4 + np.arange(width // 4)).ravel())
        total += np.bincount(words % 32, minlength=32).max()
    return total


def _ldmatrix_accesses(D, BN):
    """Every ldmatrix the kernel issues, as 32 lane addresses (tile bases are multiples of 128)."""
    RB, QB, KVB = 2 * D, BLOCK_M * 2 * D, BN * 2 * D
    for sw in (True, False):
        acc = []
        for warp in range(WARPS):
            for ks in range(D // 16):
                acc.append(tile_offset(warp * 16 + ldsm_row(LANE), 2 * ks + ldsm_chunk(LANE), RB, sw))
        for stage in range(registry.ch07_mma.MAX_STAGES):
            for np_ in range(BN // 16):
                for ks in range(D // 16):
                    acc.append(QB + stage * 2 * KVB
                               + tile_offset(16 * np_ + ldsm_row_b(LANE), 2 * ks + ldsm_chunk_b(LANE), RB, sw))
            for kp in range(BN // 16):
                for dp in range(D // 16):
                    acc.append(QB + stage * 2 * KVB + KVB
                               + tile_offset(16 * kp + ldsm_row(LANE), 2 * dp + ldsm_chunk(LANE), RB, sw))
        yield sw, acc


@pytest.mark.parametrize("D", [64, 128])
def test_swizzled_ldmatrix_is_conflict_free_and_plain_rows_conflict_8_way(D):
    var = MAIN[D]
    assert (BLOCK_M * 2 * D) % 128 == 0 and (var.BLOCK_N * 2 * D) % 128 == 0  # tile bases keep bank phase
    for sw, accesses in _ldmatrix_accesses(D, var.BLOCK_N):
        per_access = {_wavefronts(a, 16) for a in accesses}
        if sw:
            assert per_access == {4}, "x4: one wavefront per 8x8 matrix"
        else:
            assert per_access == {32}, "unswizzled: each matrix's 8 rows share one bank group"


@pytest.mark.parametrize("D", [64, 128])
def test_cp_async_stores_and_output_staging_are_conflict_free(D):
    var = MAIN[D]
    chunks = D // 8
    for rows in (BLOCK_M, var.BLOCK_N):
        for i in range(rows * chunks // THREADS):
            for warp in range(WARPS):
                idx = i * THREADS + warp * 32 + LANE
                for sw in (True, False):
                    # 16-byte stores: 8 lanes of a quarter-warp are 8 chunks of one row, a
                    # permutation of the bank groups with or without the swizzle.
                    assert _wavefronts(tile_offset(idx // chunks, idx % chunks, 2 * D, sw), 16) == 4
    for warp in range(WARPS):
        for nb in range(D // 8):
            for h in range(2):
                sts = {sw: _wavefronts(tile_offset(warp * 16 + G + 8 * h, nb, 2 * D, sw) + 4 * T, 4)
                       for sw in (True, False)}
                assert sts == {True: 1, False: 8}  # O half2 stores: 8 rows x 4 words
        for i in range(16 * chunks // 32):
            idx = i * 32 + LANE
            assert _wavefronts(tile_offset(warp * 16 + idx // chunks, idx % chunks, 2 * D, True), 16) == 4


def test_output_staging_touches_only_the_warps_own_q_rows():
    """The epilogue reuses the Q tile with only __syncwarp: each warp must write and read inside
    the 16 rows it alone read Q fragments from."""
    for D in (64, 128):
        RB, chunks = 2 * D, D // 8
        for warp in range(WARPS):
            lo, hi = warp * 16 * RB, (warp + 1) * 16 * RB
            q_reads = np.concatenate([tile_offset(warp * 16 + ldsm_row(LANE), 2 * ks + ldsm_chunk(LANE), RB, True)
                                      for ks in range(D // 16)])
            writes = np.concatenate([tile_offset(warp * 16 + G + 8 * h, nb, RB, True) + 4 * T
                                     for nb in range(D // 8) for h in range(2)])
            idx = np.arange(16 * chunks)
            reads = tile_offset(warp * 16 + idx // chunks, idx % chunks, RB, True)
            for a in (q_reads, writes, reads):
                assert ((a >= lo) & (a < hi)).all()
            written = np.unique((writes[:, None] + np.arange(4)).ravel())
            assert np.array_equal(np.unique((reads[:, None] + np.arange(16)).ravel()), written)
