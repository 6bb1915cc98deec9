"""Plausible mistakes in the kernels, each of which the CPU suite must catch (attnlab.executor.mutation).

A mutant is one textual edit of one file under kernels/: `find` must occur exactly once in it, so
a kernel change that moves the code makes the list fail loudly instead of silently testing nothing.
`kernels` names the registered kernels whose CPU suite runs against it (they must use the file).
Every bug a GPU ever finds in a kernel joins this list, with the case that found it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str                   # under kernels/
    find: str                   # exactly once in the file
    replace: str
    kernels: tuple[str, ...]    # registered kernels to run against it
    why: str                    # the mistake, as a reviewer would name it


def _drop(line: str) -> str:
    """A whole source line (with its newline), for mutants that delete it."""
    return line + "\n"


MUTANTS: tuple[Mutant, ...] = (
    # ---- bounds, tails and causal limits ------------------------------------------------------
    Mutant("01-causal-limit", "01_scalar.cu",
           "(causal ? row + 1 : L)", "(causal ? row : L)", ("01_scalar",),
           "causal row i stops before its own key (row 0 sees nothing)"),
    Mutant("01-row-bound", "01_scalar.cu",
           "const bool active = row < L;", "const bool active = row <= L;", ("01_scalar",),
           "one query row past L is read and written"),
    Mutant("02-block-keys", "02_block_tiling.cu",
           "causal ? min(L, row0 + ROWS) : L;", "causal ? min(L, row0 + ROWS - 1) : L;", ("02_block_tiling",),
           "the block's last causal key is never loaded; its last row reads a stale key"),
    Mutant("02-tile-copy-tail", "02_block_tiling.cu",
           "i < tile_keys * D; i += ROWS", "i <= tile_keys * D; i += ROWS", ("02_block_tiling",),
           "the K/V tile copy runs one element past the tile"),
    Mutant("04-causal-columns", "04_row_softmax.cu",
           "const int n = causal ? row + 1 : L;", "const int n = causal ? row + 2 : L;", ("04_cublas_hybrid",),
           "a causal row's softmax takes one column past the diagonal"),
    Mutant("04-one-step", "04_row_softmax.cu",
           "for (int it = 0; it * 32 * VEC < n; ++it) {", "for (int it = 0; it < 1; ++it) {", ("04_cublas_hybrid",),
           "the row's max and sum fold only its first warp step (256 columns); a longer row is normalized "
           "by part of its sum (only rows past L = 256 show it: cpu.CPU_LONG_LENGTHS)"),
    Mutant("wmma-key-mask", "wmma_tile.cuh",
           "s[2 * j] = (kv0 + c < key_limit)", "s[2 * j] = (kv0 + c <= key_limit)", ("05_wmma", "06_warp_specialized"),
           "every other score column keeps one key past the row's limit (a zero-padded key past L)"),
    Mutant("wmma-q-tail", "wmma_tile.cuh",
           "if (row0 + r < L) val", "if (row0 + r <= L) val", ("05_wmma",),
           "the Q staging copy reads the row at L"),
    Mutant("07-tile-tail", "07_mma_swizzle.cu",
           "const bool valid = row < L;", "const bool valid = row <= L;", ("07_mma", "07_mma_plain"),
           "cp.async copies the row at L instead of zero-filling it"),
    Mutant("07-causal-mask", "07_mma_swizzle.cu",
           "(e & 1) > key_limit[mb][e >> 1]", "(e & 1) >= key_limit[mb][e >> 1]", ("07_mma", "07_mma_plain"),
           "the causal mask also hides the diagonal (and the last key of every row)"),
    Mutant("07-merge-rescale", "07_mma_swizzle.cu",
           "o_acc[mb][nb][e] = o_acc[mb][nb][e] * c_self + slot(other, mb, nb * 4 + e) * c_other;",
           "o_acc[mb][nb][e] = o_acc[mb][nb][e] + slot(other, mb, nb * 4 + e);", ("07_mma_split2", "07_mma_split4"),
           "the split's merge adds the groups' O without rescaling each to the common row max"),
    Mutant("07-split-slice", "07_mma_swizzle.cu",
           "const int key0 = group * SUB_N;", "const int key0 = 0;", ("07_mma_split2",),
           "every warp group multiplies the tile's first slice: the other keys are never seen"),
    Mutant("07-combine-rescale", "07_mma_swizzle.cu",
           "const float w = attn::exp2_approx((m_s - m_use) * scale_log2);", "const float w = 1.f;",
           ("07_mma_split_ctas",),
           "the combine adds the CTAs' O and l without rescaling each split to the row's common max"),
    Mutant("07-cta-split-range", "07_mma_swizzle.cu",
           "tile1 = min(tile1, tile0 + per_split);", "tile1 = min(tile1, tile0 + per_split + 1);",
           ("07_mma_split_ctas",),
           "each CTA of the split also takes the next split's first key tile: those keys count twice"),
    Mutant("07-empty-split", "07_mma_swizzle.cu",
           "ml[(part_row0 + q0 + r) * 2] = ATTN_NEG_INF;", "ml[(part_row0 + q0 + r) * 2] = 0.f;",
           ("07_mma_split_ctas",),
           "a causal split that saw no key claims a max of 0: the combine weighs an O nobody wrote"),
    Mutant("07-longest-first", "07_mma_swizzle.cu",
           "q_block = causal ? gridDim.x - 1 - q_block : q_block;",
           "q_block = causal ? gridDim.x - q_block : q_block;", ("07_mma_longest_first",),
           "the reversed launch order is off by one: the first CTA takes a query tile past the last, the "
           "first tile is never computed"),
    Mutant("07-tile-skip", "07_mma_swizzle.cu",
           "if (DEFER_PV || !causal || k0 <= warp_row0 + WARP_ROWS - 1) {", "if (DEFER_PV || !causal || k0 < warp_row0) {",
           ("07_mma", "07_mma_plain"), "a warp skips the key tile that holds its own diagonal"),
    Mutant("07-tile-skip-second-block", "07_mma_swizzle.cu",
           "if (DEFER_PV || !causal || k0 <= warp_row0 + WARP_ROWS - 1) {",
           "if (DEFER_PV || !causal || k0 <= warp_row0 + 15) {",
           ("07_mma_two_row_blocks",),
           "a warp of two row blocks skips a key tile by its first block's rows: the second block's diagonal tile goes unseen"),
    Mutant("07-across-heads-pair", "07_mma_swizzle.cu",
           "bh = linear % gridDim.y;", "bh = linear / gridDim.x;", ("07_mma_across_heads",),
           "a causal CTA takes its (batch, head) pair by the grid's row, not by the interleaving: some pairs' "
           "tiles run twice and others' never"),
    Mutant("07-row-block-q", "07_mma_swizzle.cu",
           "row_warp * WARP_ROWS + 16 * mb + attn::ldsm_row(lane),", "row_warp * WARP_ROWS + attn::ldsm_row(lane),",
           ("07_mma_two_row_blocks",),
           "both row blocks of a warp take the first block's Q fragment: the second block's rows get the first's answers"),
    Mutant("07-lean-ragged-tile", "07_mma_swizzle.cu",
           "if ((next + 1) * BLOCK_N <= L) {", "if (next * BLOCK_N < L) {",
           ("07_mma_lean_loop", "07_mma_whole_tile_copy"),
           "the lean loop copies a ragged last K/V tile as a whole one: its rows past L are read past the head "
           "(past the tensor, for the last head) instead of zero-filled"),
    Mutant("07-deferred-ragged-tile", "07_mma_swizzle.cu",
           "if ((v_next + 1) * BLOCK_N <= L)", "if (v_next * BLOCK_N < L)", ("07_mma_deferred_pv",),
           "step 7.13's copy of V, a tile behind K's, takes a ragged last V tile as a whole one: its rows past L are "
           "read past the head instead of zero-filled"),
    Mutant("07-deferred-drain", "07_mma_swizzle.cu",
           "// and everyone's\n        add_pv_prev(prev_stage);", "// and everyone's", ("07_mma_deferred_pv",),
           "step 7.13 leaves the loop with the last tile's O += P V still owed: its keys never reach O"),
    Mutant("07-deferred-skip", "07_mma_swizzle.cu",
           "if (DEFER_PV || !causal || k0 <= warp_row0 + WARP_ROWS - 1) {",
           "if (!causal || k0 <= warp_row0 + WARP_ROWS - 1) {", ("07_mma_deferred_pv_two_rows",),
           "step 7.13 keeps the causal skip of a slice past the warp's rows, and with it the O += P V of the tile "
           "before, which the skipped block was to add"),
    Mutant("07-deferred-p-pack", "07_mma_swizzle.cu",
           "pack_half2(p_prev[kp][mb][2 * r], p_prev[kp][mb][2 * r + 1])",
           "pack_half2(p_prev[kp][mb][2 * r + 1], p_prev[kp][mb][2 * r])", ("07_mma_deferred_pv",),
           "step 7.13 rounds the P it held in fp32 into A fragments with each pair's two keys swapped: "
           "every key's probability multiplies its neighbour's V row"),
    Mutant("07-lean-rescale-vote", "07_mma_swizzle.cu",
           "if (!__any_sync(0xffffffffu, m_new != m_run[mb][h])) continue;",
           "if (!__all_sync(0xffffffffu, m_new != m_run[mb][h])) continue;", ("07_mma_lean_loop",),
           "the lean loop skips the rescale of O unless every row of the warp raised its max: rows whose max rose "
           "keep sums and outputs weighted against their old max"),

    # ---- barriers, removed, weakened or miscounted ---------------------------------------------
    Mutant("02-no-reuse-barrier", "02_block_tiling.cu",
           _drop("        __syncthreads();  // every row is done with the previous tile before it is overwritten"), "",
           ("02_block_tiling",),
           "the next K/V tile overwrites the one slower threads are still reading"),
    Mutant("03-warp-barrier", "03_warp_reductions.cu",
           "        __syncthreads();\n        if (t + 1 < n_tiles) load_tile(t + 1);",
           "        __syncwarp();\n        if (t + 1 < n_tiles) load_tile(t + 1);", ("03_warp_rows_4w",),
           "the block barrier of the double buffer weakened to a warp barrier"),
    Mutant("05-no-reuse-barrier", "05_wmma.cu",
           _drop("        __syncthreads();  // every warp is done reading the previous K and V tiles"), "",
           ("05_wmma",),
           "the next K/V tile overwrites the one other warps are still multiplying"),
    Mutant("05-no-syncwarp", "05_wmma.cu",
           _drop("        __syncwarp();     // S_w stored by the whole warp before lanes read rows of it"), "",
           ("05_wmma",),
           "lanes read rows of S that other lanes' WMMA store has not been ordered before"),
    Mutant("06-barrier-count", "06_warp_specialized.cu",
           "static constexpr int BARRIER_THREADS = THREADS;", "static constexpr int BARRIER_THREADS = CONSUMER_THREADS;",
           ("06_warp_specialized",),
           "the named barriers count only the consumers, though the producer arrives too"),
    Mutant("06-full-barrier-id", "06_warp_specialized.cu",
           "attn::bar_arrive(full_bar((s + STAGES - LAG) % STAGES), COUNT);", "attn::bar_arrive(full_bar(s), COUNT);",
           ("06_warp_specialized",),
           "the producer announces a landed tile on the barrier of the stage it just filled"),
    Mutant("07-no-reuse-barrier", "07_mma_swizzle.cu",
           _drop("        if constexpr (!ONE_BARRIER) __syncthreads();  "
                 "// all warps are done with this stage before a later copy refills it"), "",
           ("07_mma_two_barriers", "07_mma_single_buffer", "07_mma_plain"),
           "the prefetch refills the stage other warps are still reading (the output can stay right)"),
    Mutant("07-single-stage-wait", "07_mma_swizzle.cu",
           _drop("            attn::cp_async_wait<0>();  // this thread's copies of tile j (and Q) have landed"), "",
           ("07_mma_plain",),
           "with one stage, the barrier publishes tile j before this thread's copies of it have landed"),
    Mutant("07-prefetch-before-barrier", "07_mma_swizzle.cu",
           "                __syncthreads();  // one barrier per tile: everyone's have, and every warp is done with tile j-1\n"
           "                if constexpr (DEFER_PV) {",
           "                if constexpr (DEFER_PV) {",
           ("07_mma_nosplit",),
           "one barrier per tile, but the prefetch is issued before it: it refills the stage of tile j-1 "
           "while slower warps still multiply it, and nothing publishes tile j"),
    Mutant("07-epilogue-syncwarp", "07_mma_swizzle.cu",
           "    __syncwarp();\n#pragma unroll\n    for (int mb = 0; mb < ROW_BLOCKS; ++mb) {\n        float inv_l[2];",
           "#pragma unroll\n    for (int mb = 0; mb < ROW_BLOCKS; ++mb) {\n        float inv_l[2];", ("07_mma_nosplit",),
           "with one barrier per tile nothing orders the epilogue's staging of O after the lanes' ldmatrix "
           "of the same Q rows (a CTA of one key tile: no later barrier does it either)"),
    Mutant("07-deferred-drain-barrier", "07_mma_swizzle.cu",
           _drop("    __syncthreads();           // and everyone's"), "", ("07_mma_deferred_pv",),
           "step 7.13's last O += P V reads the last V tile before the other threads' copies of it are visible"),
    Mutant("07-merge-barrier", "07_mma_swizzle.cu",
           _drop("        __syncthreads();  // the partials are written"), "",
           ("07_mma_split2",),
           "group 0 reads the other groups' (m, l, O) before they are written"),

    # ---- cp.async group depth -------------------------------------------------------------------
    Mutant("06-wait-depth", "06_warp_specialized.cu",
           "attn::cp_async_wait<LAG>();", "attn::cp_async_wait<STAGES>();", ("06_warp_specialized", "06_ws_s1_p1"),
           "the producer announces a tile one cp.async group too early"),
    Mutant("07-wait-depth", "07_mma_swizzle.cu",
           "attn::cp_async_wait<STAGES - 1>();", "attn::cp_async_wait<STAGES>();", ("07_mma_two_barriers",),
           "the two-barrier loop waits for all but the newest STAGES groups: tile j may still be in flight"),
    Mutant("07-one-barrier-wait-depth", "07_mma_swizzle.cu",
           "attn::cp_async_wait<STAGES - 2>();", "attn::cp_async_wait<STAGES - 1>();", ("07_mma_nosplit@sm_90",),
           "with three stages the one-barrier loop waits as if the prefetch of this iteration were issued: "
           "tile j may still be in flight"),
    Mutant("07-deferred-v-stage", "07_mma_swizzle.cu",
           "v_stage = (stage + STAGES - 2) % STAGES;", "v_stage = next_stage;",
           ("07_mma_deferred_pv@sm_90",),
           "step 7.13 refills tile j-1's V stage, as the K copy does, though tile j-1's O += P V is still to read it "
           "this trip"),
    Mutant("07-stage-rotation", "07_mma_swizzle.cu",
           "next_stage = stage == 0 ? STAGES - 1 : stage - 1;", "next_stage = stage + 1 == STAGES ? 0 : stage + 1;",
           ("07_mma_nosplit@sm_90",),
           "the prefetch refills the stage after tile j's, where tile j+1 is still landing, not tile j-1's "
           "(the same stage with two: only three stages tell them apart)"),

    # ---- fragments and lane maps ----------------------------------------------------------------
    Mutant("07-missing-trans", "07_mma_swizzle.cu",
           "attn::ldsm_x4_trans(vf, v_tile(stage)", "attn::ldsm_x4(vf, v_tile(stage)", ("07_mma", "07_mma_plain"),
           "V is loaded without .trans: B fragments of V^T instead of V"),
    Mutant("07-swapped-fragment", "07_mma_swizzle.cu",
           "attn::mma_16816(s[mb][2 * np], q_frag[mb][ks], kf[0], kf[1]);",
           "attn::mma_16816(s[mb][2 * np], q_frag[mb][ks], kf[1], kf[0]);",
           ("07_mma", "07_mma_plain"),
           "the two B registers of a K fragment swapped"),
    Mutant("07-q-from-tile-kstep", "07_mma_swizzle.cu",
           "attn::ldsm_x4(qf[mb], q_tile + (q_lane ^ (ks << 5))", "attn::ldsm_x4(qf[mb], q_tile + (q_lane ^ (ks << 4))", ("07_mma_q_from_tile",),
           "two row blocks at D = 128 step Q's k-step chunks by one 16-byte chunk instead of two: k-step ks "
           "reads Q's chunks ks, ks + 1 where K's are 2 ks, 2 ks + 1"),
    Mutant("07-q-from-tile-row-block", "07_mma_swizzle.cu",
           "(q_lane ^ (ks << 5)) + 16 * mb * ROW_BYTES);", "(q_lane ^ (ks << 5)));", ("07_mma_q_from_tile",),
           "with two row blocks at D = 128 the second block reads the first block's Q rows from the tile"),
    Mutant("lane-map-b", "swizzle.cuh",
           "ldsm_row_b(int lane) { return (lane & 7) + ((lane >> 4) << 3); }", "ldsm_row_b(int lane) { return lane & 15; }",
           ("07_mma",),
           "the K operand's ldmatrix addresses use the A operand's lane-to-row map"),
    Mutant("swizzle-or", "swizzle.cuh",
           "(chunk ^ (row & 7))", "(chunk | (row & 7))", ("07_mma",),
           "OR instead of XOR: the swizzle is no longer a permutation, chunks collide"),
    Mutant("swizzle-period", "swizzle.cuh",
           "(chunk ^ (row & 7))", "(chunk ^ (row & 3))", ("07_mma",),
           "the swizzle cycles over 4 rows, not 8: right answers, 2-way ldmatrix bank conflicts"),

    # ---- shuffles: offsets, widths and masks ----------------------------------------------------
    Mutant("shuffle-width", "common.cuh",
           "if (off < width) v += __shfl_xor_sync", "if (off <= width) v += __shfl_xor_sync", ("03_warp_rows_4w",),
           "warp_sum also adds the neighbouring group of lanes (another query row)"),
    Mutant("shuffle-max-offset", "common.cuh",
           "v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));", "v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off >> 1));",
           ("04_cublas_hybrid",),
           "warp_max skips the xor-1 step: odd and even lanes disagree on the row max"),
    Mutant("07-quad-offset", "07_mma_swizzle.cu",
           "x += __shfl_xor_sync(0xffffffffu, x, 2);", "x += __shfl_xor_sync(0xffffffffu, x, 4);", ("07_mma", "07_mma_plain"),
           "the row sum adds the neighbouring quad (rows g and g+1 mixed) instead of the quad's other pair"),
    Mutant("07-quad-mask", "07_mma_swizzle.cu",
           "mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));", "mx = fmaxf(mx, __shfl_xor_sync(0x0000ffffu, mx, 2));",
           ("07_mma", "07_mma_plain"),
           "a shuffle mask naming half the warp, called by all of it"),
)
