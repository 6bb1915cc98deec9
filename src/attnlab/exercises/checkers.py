"""The exercises' checkers (attnlab.exercises.registry names them): what each runs the reader's
file on, and what passes.

Every checker builds the reader's file (`harness.build`), runs it at several shapes and seeds on
the CPU executor, and raises `Fail` with one line at the first thing wrong: a finding (its kind,
message and the reader's source line), a bank conflict where the exercise is about banks, or a
wrong number (the pass rule for attention-shaped kernels; exact values for the small ones). Shapes
are small (the executor runs every thread on one core): a check takes a few seconds.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..shapes import Shape
from .harness import Buffer, Fail, attention_cases, banks_fail, build, findings_fail, launch, run_attention


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _passes(n: int, extra: str = "") -> str:
    return f"passes at {n} cases (shapes, seeds, causal and not), 0 findings" + (f", {extra}" if extra else "")


# ---- chapter 1: the scalar kernel ---------------------------------------------------------------

CH01_CASES = [(Shape(1, 2, 20, 64), False, 0), (Shape(1, 2, 20, 64), True, 1), (Shape(1, 1, 65, 32), True, 2),
              (Shape(2, 1, 40, 64), False, 3), (Shape(1, 2, 1, 16), True, 4)]


# Every row's largest scores in its first chunk of keys, the later ones about 100 lower: a running
# max that follows the chunk's own max drops by 100 there, and exp(m - m_new) = e^100 overflows fp32.
CH01_EARLY_MAX = (Shape(1, 2, 37, 64), False, 5)


def _ch01_config(s):
    return (_cdiv(s.L, 128), s.B * s.H), (128,), 0


def _early_max_inputs(shape, seed: int):
    """q about 2 everywhere; keys 0-7 about 4 (scores about +64 at D = 64), the rest about -2.5
    (scores about -40), each with noise, so that the first chunk's softmax is not one-hot."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    B, H, L, D = shape

    def draw(mean, std, rows):
        return mean + std * torch.randn((B, H, rows, D), generator=gen)

    q = draw(2.0, 0.1, L)
    k = torch.cat([draw(4.0, 0.5, 8), draw(-2.5, 0.5, L - 8)], dim=2)
    v = draw(0.5, 1.0, L)
    return tuple(t.to(torch.float16) for t in (q, k, v))


def ch01(path: Path) -> str:
    import torch

    from .harness import case_text, judge_attention

    lib = build(path, ["attn_ex01_scalar"])
    n = attention_cases(lib, "attn_ex01_scalar", CH01_CASES, _ch01_config)
    shape, causal, seed = CH01_EARLY_MAX
    case = case_text(shape, causal, seed) + ", the row's max in its first chunk, later scores ~100 lower"
    out, report, q, k, v = run_attention(lib, "attn_ex01_scalar", shape, causal, seed, *_ch01_config(shape),
                                         inputs=_early_max_inputs(shape, seed))
    findings_fail(report, case)
    if not torch.isfinite(out).all():
        rows = int((~torch.isfinite(out)).any(dim=-1).sum())
        raise Fail(f"{case}: {rows} of {shape.B * shape.H * shape.L} rows come out NaN/Inf: the running max must "
                   "never decrease: a chunk whose scores are all below m leaves m as it is; a max that drops to "
                   "that chunk's own makes the rescale exp(m - m_new) about e^100, past fp32's range")
    judge_attention(out, q, k, v, causal, case)
    return _passes(n + 1)


# ---- chapter 2: block tiling ----------------------------------------------------------------------

CH02_ENTRY = "attn_ex02_block_tiling"
# L = 65 and 100: three and four key tiles, so that a tile is overwritten while (without a barrier)
# another thread may still read the one before; L = 200: two query blocks.
CH02_CASES = [(Shape(1, 2, 65, 64), False, 0), (Shape(1, 1, 100, 32), True, 1), (Shape(1, 1, 200, 64), True, 2),
              (Shape(2, 1, 33, 16), False, 3)]


def _ch02_config(s):
    return (_cdiv(s.L, 128), s.B * s.H), (128,), 0


def ch02_barriers(path: Path) -> str:
    lib = build(path, [CH02_ENTRY])
    return _passes(attention_cases(lib, CH02_ENTRY, CH02_CASES, _ch02_config))


def ch02_pad(path: Path) -> str:
    lib = build(path, [CH02_ENTRY])
    # Bank counts at non-causal shapes only: there every lane of a warp runs each load and store
    # the same number of times, so the executor's grouping of lanes into requests is the GPU's.
    n = attention_cases(lib, CH02_ENTRY, [(Shape(1, 2, 65, 64), False, 0), (Shape(1, 1, 40, 32), False, 1),
                                          (Shape(1, 1, 130, 16), False, 2)], _ch02_config, banks_kinds=("ld/st",))
    n += attention_cases(lib, CH02_ENTRY, [(Shape(1, 1, 100, 64), True, 3)], _ch02_config)
    return _passes(n, "every shared load and store at its ideal wavefronts")


# ---- chapter 3: warp reductions -------------------------------------------------------------------

def _group_reduce(x: np.ndarray, n_threads: int, width: int, op, neutral: float) -> np.ndarray:
    """Each thread's expected result: op over its aligned group of `width` threads (lanes past
    len(x) take the neutral element)."""
    padded = np.full(n_threads, neutral, np.float64)
    padded[: len(x)] = x
    return np.repeat(op(padded.reshape(-1, width), axis=1), width)[: len(x)]


def ch03_reduce(path: Path) -> str:
    lib = build(path, ["ex03_group_reduce"])
    n_threads, n = 256, 200   # two blocks of 128; the last 56 threads hold no element
    cases = 0
    for seed in (0, 1, 2):
        rng = np.random.default_rng(seed)
        x = rng.integers(-64, 65, n).astype(np.float32)  # integers: every sum is exact in any order
        for width in (8, 32, 4, 16, 2, 1):
            case = f"width={width} seed {seed}" if seed else f"width={width}"
            got_sum = np.zeros(n, np.float32)
            got_max = np.zeros(n, np.float32)
            report = launch(lib, "ex03_group_reduce", (2,), (128,), 0,
                            [Buffer(x, "x"), Buffer(got_sum, "sum", out=True), Buffer(got_max, "max", out=True),
                             n, width], seed=seed)
            findings_fail(report, case)
            for what, got, op, neutral in (("sum", got_sum, np.sum, 0.0), ("max", got_max, np.max, -np.inf)):
                want = _group_reduce(x, n_threads, width, op, neutral)
                bad = np.nonzero(got != want)[0]
                if len(bad):
                    raise Fail(f"{case}: wrong {what} at lane {bad[0] % 32} of warp {bad[0] // 32}: {got[bad[0]]:g} "
                               f"where its group of {width} lanes gives {want[bad[0]]:g}"
                               f"{_ch03_diagnosis(x, got, want, n_threads, width, op, neutral)}")
            cases += 1
    return f"passes at {cases} cases (every width 1..32, three seeds), exact in every lane, 0 findings"


def _ch03_diagnosis(x, got, want, n_threads, width, op, neutral) -> str:
    if np.array_equal(got, x):
        return " (every lane returned its own value: nothing was reduced)"
    if width < 32 and np.array_equal(got, _group_reduce(x, n_threads, 32, op, neutral)):
        return " (every lane holds the whole warp's result: lanes of other groups leak in; keep off < width)"
    first = np.arange(len(x)) % width == 0
    if np.array_equal(got[first], want[first]):
        return (" (the first lane of each group is right, the others not: a shift down leaves the result in "
                "one lane; a butterfly, __shfl_xor_sync, leaves it in all)")
    return ""


# Chapter 3's kernel (attn_ex03_warp_rows): 4 warps, rows of G lanes, G = the smallest power of two
# with 8 G >= D. D = 40 and 24 leave lanes without a slice.
CH03_ENTRY = "attn_ex03_warp_rows"
CH03_CASES = [(Shape(1, 2, 33, 64), False, 0), (Shape(1, 1, 40, 32), True, 1), (Shape(1, 1, 17, 128), False, 2),
              (Shape(1, 2, 21, 40), True, 3), (Shape(2, 1, 70, 16), False, 4), (Shape(1, 1, 9, 24), True, 5),
              (Shape(1, 1, 12, 8), False, 6)]


def _lanes_per_row(D: int) -> int:
    g = 1
    while g * 8 < D:
        g *= 2
    return g


def ch03_rows(path: Path) -> str:
    lib = build(path, [CH03_ENTRY])
    n = attention_cases(lib, CH03_ENTRY, CH03_CASES,
                        lambda s: ((_cdiv(s.L, 128 // _lanes_per_row(s.D)), s.B * s.H), (128,), 256 * s.D))
    return _passes(n)


# ---- chapter 4: the row softmax of the cuBLAS hybrid ------------------------------------------------

CH04_ENTRY = "attn_ex04_softmax"
# L % 8 != 0 takes the 2-byte path; 300 is two warp steps of 256 columns; 64 the 16-byte path.
CH04_CASES = [(Shape(1, 2, 17, 64), False, 0), (Shape(1, 1, 65, 32), True, 1), (Shape(1, 1, 300, 16), True, 2),
              (Shape(1, 1, 300, 16), False, 3), (Shape(1, 2, 64, 64), True, 4), (Shape(2, 1, 13, 32), False, 5)]


def ch04(path: Path) -> str:
    """S = Q K^T in fp16 (PyTorch, as cuBLAS makes it), the reader's softmax over it in place on the
    executor, O = P V in fp16, judged by the pass rule."""
    import torch

    from .harness import attention_inputs, case_text, judge_attention

    lib = build(path, [CH04_ENTRY])
    for shape, causal, seed in CH04_CASES:
        case = case_text(shape, causal, seed)
        q, k, v = attention_inputs(shape, seed)
        s = (q.float() @ k.float().transpose(-2, -1)).half().contiguous().numpy()
        report = launch(lib, CH04_ENTRY, (_cdiv(shape.L, 4), shape.B * shape.H), (128,), 0,
                        [Buffer(s, "S", out=True), shape.L, 1.0 / math.sqrt(shape.D), int(causal)], seed=seed)
        findings_fail(report, case)
        out = (torch.from_numpy(s).float() @ v.float()).half()
        judge_attention(out, q, k, v, causal, case)
    return _passes(len(CH04_CASES))


# ---- chapter 5: WMMA -------------------------------------------------------------------------------

CH05_ENTRY = "attn_ex05_wmma"
CH05_SMEM = 2 * 64 * 72 * 2 + 64 * 68 * 4 + 64 * 72 * 2 + 64 * 68 * 4  # K, V, S, P, O at D = 64 (62464)
CH05_CASES = [(Shape(1, 2, 40, 64), False, 0), (Shape(1, 1, 130, 64), True, 1), (Shape(1, 1, 65, 64), False, 2),
              (Shape(2, 1, 17, 64), True, 3)]


def ch05(path: Path) -> str:
    lib = build(path, [CH05_ENTRY])
    n = attention_cases(lib, CH05_ENTRY, CH05_CASES, lambda s: ((_cdiv(s.L, 64), s.B * s.H), (128,), CH05_SMEM))
    return _passes(n, "under a new random fragment layout each seed")


# ---- chapter 6: warp specialization ---------------------------------------------------------------

CH06_ENTRY = "attn_ex06_ring"
CH06_SMEM = 2 * 2 * 64 * 72 * 2 + 64 * 68 * 4 + 64 * 72 * 2 + 64 * 68 * 4  # two K/V stages, S, P, O (80896)
# L = 200: four key tiles, so each ring stage is filled, released and refilled; 65: two, the
# second mostly zero-filled.
CH06_CASES = [(Shape(1, 1, 200, 64), False, 0), (Shape(1, 2, 65, 64), True, 1), (Shape(1, 1, 130, 64), True, 2),
              (Shape(2, 1, 17, 64), False, 3)]


def _ch06_config(s):
    return (_cdiv(s.L, 64), s.B * s.H), (160,), CH06_SMEM


def ch06(path: Path) -> str:
    lib = build(path, [CH06_ENTRY])
    n = attention_cases(lib, CH06_ENTRY, CH06_CASES, _ch06_config)
    # Right and clean: now, does the side that only signals go on without waiting? One block (rows
    # 0-63) of L = 256 walks four key tiles: the producer publishes 4 (32 threads each), the
    # consumers release the 2 stages the producer refills (128 threads each).
    shape = Shape(1, 1, 256, 64)
    _, block, smem = _ch06_config(shape)
    _, report, *_ = run_attention(lib, CH06_ENTRY, shape, False, 0, (1, 1), block, smem, count=True)
    findings_fail(report, "L=256 D=64, one block")
    arrives = sum(st.lanes for c in report.counts for st in c.sites if st.kind == "bar.arrive")
    want = 4 * 32 + 2 * 128
    if arrives < want:
        raise Fail(f"right and clean, but the signalling side waits: {arrives} bar.arrive (thread-arrivals) where "
                   f"the ring makes {want} in a block of four tiles. producer_publish and consumer_release only "
                   "announce: with bar_sync the producer can no longer copy ahead of the consumers (the overlap "
                   "the chapter is for)")
    return _passes(n, "signals by bar.arrive")


# ---- chapter 7: mma.sync, ldmatrix, swizzle, cp.async ring ----------------------------------------

def _ldsm_expected(tile: np.ndarray, row0: int, chunk0: int, order: str, trans: bool) -> np.ndarray:
    """What ldmatrix.x4 (PTX ISA 9.7.14.5.15) leaves in each lane's four registers, [32 lanes, 4
    registers, 2 halves], when the lanes name the chapter's blocks of 16 rows x 2 chunks: in Q
    order matrix i is (rows 8 (i % 2).., chunk i / 2), in K order (rows 8 (i / 2).., chunk i % 2).
    Lane l's register i holds row l / 4 of matrix i, halves 2 (l % 4) and + 1 (.trans: column l / 4,
    rows 2 (l % 4) and + 1)."""
    out = np.zeros((32, 4, 2), tile.dtype)
    for i in range(4):
        rows, chunk = (8 * (i & 1), i >> 1) if order == "a" else (8 * (i >> 1), i & 1)
        m = tile[row0 + rows: row0 + rows + 8, (chunk0 + chunk) * 8: (chunk0 + chunk) * 8 + 8]
        for lane in range(32):
            for e in range(2):
                out[lane, i, e] = m[2 * (lane % 4) + e, lane // 4] if trans else m[lane // 4, 2 * (lane % 4) + e]
    return out


def ch07_swizzle(path: Path) -> str:
    entries = {64: "ex07_swizzle_d64", 128: "ex07_swizzle_d128"}
    lib = build(path, list(entries.values()))
    cases = 0
    for D, entry in entries.items():
        for seed in (0, 1):
            case = f"D={D} (rows of {2 * D} bytes)" + (f" seed {seed}" if seed else "")
            ks = D // 16
            tile = (np.arange(64 * D, dtype=np.uint16) + 1).reshape(64, D)  # every element tells its place
            frags = {name: np.zeros((4, ks, 32, 4), np.uint32) for name in "abt"}
            back = np.zeros_like(tile)
            report = launch(lib, entry, (1,), (128,), 64 * D * 2,
                            [Buffer(tile, "tile"), *(Buffer(frags[n], n, out=True) for n in "abt"),
                             Buffer(back, "back", out=True)], seed=seed, banks=True)
            findings_fail(report, case)
            bad = np.argwhere(back != tile)
            if len(bad):
                r, c = (int(x) for x in bad[0])
                got = int(back[r, c]) - 1
                raise Fail(f"{case}: reading back row {r} chunk {c // 8} gives row {got // D} chunk {got % D // 8}: two "
                           "(row, chunk) pairs share one address, so one overwrote the other; swizzled() must map "
                           "the chunks of a row one-to-one onto that row's chunk positions")
            for name, order, trans in (("a", "a", False), ("b", "b", False), ("t", "a", True)):
                got = frags[name].view(np.uint16).reshape(4, ks, 32, 4, 2)
                for w in range(4):
                    for k in range(ks):
                        want = _ldsm_expected(tile, 16 * w, 2 * k, order, trans)
                        if not np.array_equal(got[w, k], want):
                            lane, reg, _ = (int(x) for x in np.argwhere(got[w, k] != want)[0])
                            raise Fail(f"{case}: ldmatrix{' .trans' if trans else ''} of warp {w}, k-step {k}: lane "
                                       f"{lane} register {reg} is wrong although the tile reads back whole")
            banks_fail(report, case, ("ldmatrix", "cp.async", "ld/st"))
            cases += 1
    return (f"passes at {cases} cases (D = 64 and 128), every ldmatrix register as the PTX table says, "
            "ldmatrix, cp.async and 16-byte loads at their ideal wavefronts, 0 findings")


def _mma_operand(M: np.ndarray, ks: int, order: str) -> np.ndarray:
    """The registers mma.sync.m16n8k16 (PTX ISA 9.7.14.5.8) takes at k-step ks, [32 lanes, 4, 2 halves]:
    A order, Q's a0..a3 (rows g, g+8; columns 2t.., 8+2t..); B order, K's b0, b1 of keys 0-7 then of
    keys 8-15 (g = lane / 4, t = lane % 4)."""
    out = np.zeros((32, 4, 2), M.dtype)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            row, half = (g + 8 * (i & 1), i >> 1) if order == "a" else (g + 8 * (i >> 1), i & 1)
            for e in range(2):
                out[lane, i, e] = M[row, 16 * ks + 8 * half + 2 * t + e]
    return out


def ch07_lanes(path: Path) -> str:
    lib = build(path, ["ex07_ldmatrix_lanes"])
    D, KS = 64, 4
    # 1. Every element tells where it came from: Q's are 1..1024, K's 2049..3072 (as 16-bit patterns).
    ids = np.arange(16 * D, dtype=np.uint16).reshape(16, D)
    q, k = ids + 1, ids + 2049
    qa, kb = np.zeros((KS, 32, 4), np.uint32), np.zeros((KS, 32, 4), np.uint32)
    report = launch(lib, "ex07_ldmatrix_lanes", (1,), (32,), 2 * 16 * D * 2,
                    [Buffer(q, "Q"), Buffer(k, "K"), Buffer(qa, "qa", out=True), Buffer(kb, "kb", out=True),
                     Buffer(np.zeros((16, 16), np.float32), "S")])
    findings_fail(report, "fragments")
    for name, regs, M, base, order in (("Q (A order)", qa, q, 1, "a"), ("K (B order)", kb, k, 2049, "b")):
        got = regs.view(np.uint16).reshape(KS, 32, 4, 2)
        for ks in range(KS):
            want = _mma_operand(M, ks, order)
            if np.array_equal(got[ks], want):
                continue
            lane, i, e = (int(x) for x in np.argwhere(got[ks] != want)[0])
            w_row, w_col = divmod(int(want[lane, i, e]) - base, D)
            found = int(got[ks, lane, i, e]) - base
            src = 8 * i + lane // 4  # the lane whose address gave this row of matrix i
            need = f"row {w_row}, chunk {(w_col - 16 * ks) // 8}"
            if 0 <= found < 16 * D:
                f_row, f_col = divmod(found, D)
                have = (f"row {f_row}, chunk {(f_col - 16 * ks) // 8}" if f_col // 16 == ks
                        else f"row {f_row}, column {f_col} (another k-step's chunk)")
                what = f"{'Q' if order == 'a' else 'K'}[{f_row}][{f_col}]"
            else:
                have, what = "something else", "a value from neither block"
            raise Fail(f"{name}, k-step {ks}: lane {lane}'s register {i} holds {what} where mma.sync wants "
                       f"{'Q' if order == 'a' else 'K'}[{w_row}][{w_col}]: that row of matrix {i} is named by lane "
                       f"{src} (lanes {8 * i}-{8 * i + 7} name matrix {i}'s rows), which names {have} instead of {need}")
    # 2. The products, with small integers (exact in fp16 and in fp32 sums).
    rng = np.random.default_rng(0)
    qf, kf = (rng.integers(-3, 4, (16, D)).astype(np.float16) for _ in range(2))
    got_s = np.zeros((16, 16), np.float32)
    report = launch(lib, "ex07_ldmatrix_lanes", (1,), (32,), 2 * 16 * D * 2,
                    [Buffer(qf, "Q"), Buffer(kf, "K"), Buffer(np.zeros((KS, 32, 4), np.uint32), "qa"),
                     Buffer(np.zeros((KS, 32, 4), np.uint32), "kb"), Buffer(got_s, "S", out=True)], seed=1)
    findings_fail(report, "S = Q K^T")
    want_s = qf.astype(np.float32) @ kf.astype(np.float32).T
    if not np.array_equal(got_s, want_s):
        r, c = (int(x) for x in np.argwhere(got_s != want_s)[0])
        raise Fail(f"S = Q K^T: S[{r}][{c}] = {got_s[r, c]:g} where Q K^T has {want_s[r, c]:g}")
    return "passes: every Q and K register as mma.sync's tables say (4 k-steps), S = Q K^T exact, 0 findings"


def ch07_wait(path: Path) -> str:
    entries = {2: "ex07_ring_s2", 3: "ex07_ring_s3", 4: "ex07_ring_s4"}
    lib = build(path, [*entries.values(), "ex07_wait_depths"])
    cases = 0
    for stages, entry in entries.items():
        for rows, seed in ((200, 0), (96, 1), (33, 2)):  # 7 tiles (the ring wraps), 3, 2 (one partial)
            case = f"STAGES={stages}, {rows} rows ({_cdiv(rows, 32)} tiles)" + (f" seed {seed}" if seed else "")
            x = np.random.default_rng(seed).integers(-4, 5, (2, rows, 64)).astype(np.float16)
            out = np.zeros((2, 2, 64), np.float32)
            report = launch(lib, entry, (2,), (128,), stages * 4096, [Buffer(x, "x"), Buffer(out, "out", out=True), rows],
                            seed=seed)
            findings_fail(report, case)
            padded = np.zeros((2, _cdiv(rows, 32) * 32, 64), np.float32)
            padded[:, :rows] = x
            want = padded.reshape(2, -1, 2, 16, 64).sum(axis=(1, 3))
            if not np.array_equal(out, want):
                b, h, c = (int(v) for v in np.argwhere(out != want)[0])
                raise Fail(f"{case}: wrong sum in block {b}, column {c}: {out[b, h, c]:g} where the rows give "
                           f"{want[b, h, c]:g}")
            cases += 1
    depths = np.zeros(3, np.int32)
    findings_fail(launch(lib, "ex07_wait_depths", (1,), (32,), 0, [Buffer(depths, "depths", out=True)]), "depths")
    for stages, depth in zip(entries, (int(d) for d in depths)):
        if depth < stages - 2:
            raise Fail(f"right and clean, but at STAGES={stages} wait_group {depth} also waits for tile j+1's copies "
                       f"(and later ones), issued tiles ago to overlap the work on tile j: the ring keeps "
                       f"{depth} group{'s' * (depth != 1)} in flight where it may keep {stages - 2}")
    return f"passes at {cases} cases (2, 3 and 4 stages), 0 findings, and waits no deeper than it must"

