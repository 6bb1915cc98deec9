"""CPU models of kernels 02, 03 and 04, in fp32 and in each kernel's order of operations: tile
and chunk loops, one max and one rescale per chunk or tile, causal tile skipping, tails where L
is not a tile multiple, the lanes that split D and the butterfly (xor) reductions over 32 lanes.
Each model must meet the pass rule against the fp64 reference on the same inputs, as the kernel
must on a GPU. The warp-reduction tests show that the earlier study's two reduction bugs fail the
same assertions (and, inside the chapter 3 model, the pass rule); a GPU test runs those
assertions on kernels/test_warp_reduce.cu.

The models agree with the kernels in algorithm and order, not to the bit: __expf and np.exp
round differently.
"""
import re

import numpy as np
import pytest
import torch

from attnlab.kernels import registry
from attnlab.pass_rule import judge, make_inputs
from attnlab.paths import kernels_dir
from attnlab.reference import naive_fp16, reference_attention
from attnlab.shapes import Shape

F32, F64, F16 = np.float32, np.float64, np.float16
NEG_INF = F32(-np.inf)


def constant(source: str, name: str) -> int:
    """An `constexpr int NAME = value;` of a kernel source, so the models use the kernel's numbers."""
    text = (kernels_dir() / source).read_text()
    return int(re.search(rf"constexpr int {name} = (\d+);", text).group(1))


TILING_ROWS = constant("02_block_tiling.cu", "ROWS")
TILING_KEYS = constant("02_block_tiling.cu", "KEYS")
TILING_CHUNK = constant("02_block_tiling.cu", "KEY_CHUNK")
WARP_KEYS = constant("03_warp_reductions.cu", "KEYS")
WARP_VEC = constant("03_warp_reductions.cu", "VEC")
SOFTMAX_VEC = constant("04_row_softmax.cu", "VEC")


# ---- fp32 building blocks, as the kernels use them ------------------------------------------------

def fma32(a, b, c):
    """fmaf(a, b, c): the product of two fp32 numbers is exact in fp64, so one rounding to fp32."""
    return (np.asarray(a, F32).astype(F64) * np.asarray(b, F32) + np.asarray(c, F32)).astype(F32)


def safe_exp_diff(x, m):
    """attn::safe_exp_diff: exp(x - m), and 0 where m is -inf (a row that has seen no key yet)."""
    with np.errstate(invalid="ignore"):
        return np.where(m == NEG_INF, F32(0), np.exp((x - m).astype(F32), dtype=F32)).astype(F32)


def butterfly(values, width, op):
    """attn::warp_sum / attn::warp_max over the last axis (32 lanes): at each step off = 16..1 with
    off < width, lane i combines its value with lane i ^ off's. Returns every lane's result."""
    assert values.shape[-1] == 32
    lanes = np.arange(32)
    v = values.astype(F32)
    off = 16
    while off > 0:
        if off < width:
            v = op(v, v[..., lanes ^ off]).astype(F32)
        off >>= 1
    return v


def warp_sum(values, width=32):
    return butterfly(values, width, np.add)


def warp_max(values, width=32):
    return butterfly(values, width, np.maximum)


# ---- the chapter 2 model ----------------------------------------------------------------------------

def model_02(q, k, v, causal, scale):
    q, k, v = (t.float().numpy() for t in (q, k, v))
    B, H, L, D = q.shape
    out = np.full((B, H, L, D), np.nan, F16)  # poisoned, like the GPU check's output
    jj = np.arange(TILING_CHUNK)
    for b in range(B):
        for h in range(H):
            Q, K, V = q[b, h], k[b, h], v[b, h]
            S = np.zeros((L, L), F32)  # dot = fmaf(q_d, k_d, dot) for d = 0..D-1, then * scale
            for d in range(D):
                S = fma32(Q[:, d, None], K[None, :, d], S)
            S = (S * F32(scale)).astype(F32)
            for row0 in range(0, L, TILING_ROWS):                 # one block
                rows = np.arange(row0, min(row0 + TILING_ROWS, L))  # its active threads
                n_keys = rows + 1 if causal else np.full(rows.size, L)
                block_keys = min(L, row0 + TILING_ROWS) if causal else L  # tiles past it are skipped
                acc = np.zeros((rows.size, D), F32)
                m = np.full(rows.size, NEG_INF)
                l = np.zeros(rows.size, F32)
                for j0 in range(0, block_keys, TILING_KEYS):
                    n = np.minimum(TILING_KEYS, n_keys - j0)
                    for c0 in range(0, TILING_KEYS, TILING_CHUNK):
                        live = c0 < n                           # rows that run this chunk
                        if not live.any():
                            break
                        valid = (c0 + jj)[None, :] < n[:, None]
                        cols = np.minimum(j0 + c0 + jj, L - 1)
                        s = np.where(valid, S[rows][:, cols], NEG_INF)
                        m_new = np.maximum(m, s.max(1))
                        corr = safe_exp_diff(m, m_new)
                        l_new = (l * corr).astype(F32)
                        acc_new = (acc * corr[:, None]).astype(F32)
                        for e in range(TILING_CHUNK):           # l += p; acc = fmaf(p, v, acc), in key order
                            ok = valid[:, e]
                            p = np.where(ok, np.exp((s[:, e] - m_new).astype(F32), dtype=F32), F32(0))
                            l_new = np.where(ok, (l_new + p).astype(F32), l_new)
                            acc_new = np.where(ok[:, None], fma32(p[:, None], V[cols[e]][None, :], acc_new), acc_new)
                        m = np.where(live, m_new, m)
                        l = np.where(live, l_new, l)
                        acc = np.where(live[:, None], acc_new, acc)
                out[b, h, rows] = (acc * (F32(1) / l)[:, None]).astype(F16)
    return torch.from_numpy(out)


# ---- the chapter 3 model ----------------------------------------------------------------------------

def group_dots(partial, G, reduce):
    """The scores of kernel 03 from per-lane partial dot products `partial[row, c, key]`: rows are
    laid out in warps (32 / G rows of G lanes each), reduced with `reduce(values[..., 32], G)`,
    and each row reads its lane c = 0. Rows are padded to whole warps with zero partials, as the
    inactive rows of a block hold q = 0."""
    L_rows, _, n_keys = partial.shape
    per_warp = 32 // G
    warps = -(-L_rows // per_warp)
    lanes = np.zeros((warps * per_warp, G, n_keys), F32)
    lanes[:L_rows] = partial
    lanes = lanes.reshape(warps, 32, n_keys).transpose(0, 2, 1)       # [warp, key, lane]
    reduced = reduce(lanes, G).transpose(0, 2, 1).reshape(warps * per_warp, G, n_keys)
    return reduced[:L_rows, 0, :]


def model_03(q, k, v, causal, scale, warps=4, reduce=warp_sum):
    q, k, v = (t.float().numpy() for t in (q, k, v))
    B, H, L, D = q.shape
    G = registry.ch03_warp_reductions.lanes_per_row(D)
    rows_per_block = registry.ch03_warp_reductions.rows_per_block(warps, D)
    out = np.full((B, H, L, D), np.nan, F16)
    width = G * WARP_VEC
    for b in range(B):
        for h in range(H):
            Qp = np.zeros((L, width), F32)
            Kp = np.zeros((L, width), F32)
            Qp[:, :D] = (q[b, h] * F32(scale)).astype(F32)  # qf[i] *= scale, once per row
            Kp[:, :D] = k[b, h]
            V = v[b, h]
            # Lane c: dot = fmaf(qf[i], kf[i], dot), i = 0..7 over elements 8c..8c+7 (0 past D).
            partial = np.zeros((L, G, L), F32)
            for i in range(WARP_VEC):
                partial = fma32(Qp[:, i::WARP_VEC][:, :, None], Kp[:, i::WARP_VEC].T[None, :, :], partial)
            S = group_dots(partial, G, reduce)
            for row0 in range(0, L, rows_per_block):
                rows = np.arange(row0, min(row0 + rows_per_block, L))
                n_keys = rows + 1 if causal else np.full(rows.size, L)
                block_keys = min(L, row0 + rows_per_block) if causal else L
                acc = np.zeros((rows.size, D), F32)
                m = np.full(rows.size, NEG_INF)
                l = np.zeros(rows.size, F32)
                for j0 in range(0, block_keys, WARP_KEYS):      # one tile, one barrier
                    n = np.minimum(WARP_KEYS, n_keys - j0)
                    valid = np.arange(WARP_KEYS)[None, :] < n[:, None]
                    cols = np.minimum(j0 + np.arange(WARP_KEYS), L - 1)
                    s = np.where(valid, S[rows][:, cols], NEG_INF)
                    m_new = np.maximum(m, s.max(1))              # one max and one rescale per tile
                    corr = safe_exp_diff(m, m_new)
                    l = (l * corr).astype(F32)
                    acc = (acc * corr[:, None]).astype(F32)
                    for e in range(WARP_KEYS):
                        ok = valid[:, e]
                        p = np.where(ok, np.exp((s[:, e] - m_new).astype(F32), dtype=F32), F32(0))
                        l = np.where(ok, (l + p).astype(F32), l)
                        acc = np.where(ok[:, None], fma32(p[:, None], V[cols[e]][None, :], acc), acc)
                    m = m_new
                res = (acc * (F32(1) / l)[:, None]).astype(F16)
                for c in range(D // WARP_VEC):                   # lanes with a slice store 8 halves
                    out[b, h, rows, c * WARP_VEC:(c + 1) * WARP_VEC] = res[:, c * WARP_VEC:(c + 1) * WARP_VEC]
    return torch.from_numpy(out)


# ---- the chapter 4 model ----------------------------------------------------------------------------

def softmax_columns(L):
    """column(it, lane, e) of kernels/04_row_softmax.cu: [steps, 32 lanes, 8] column indices."""
    steps = -(-L // (32 * SOFTMAX_VEC))
    it, lane, e = np.meshgrid(np.arange(steps), np.arange(32), np.arange(SOFTMAX_VEC), indexing="ij")
    if L % SOFTMAX_VEC == 0:
        return (it * 32 + lane) * SOFTMAX_VEC + e
    return it * 32 * SOFTMAX_VEC + e * 32 + lane


def model_04(q, k, v, causal, scale):
    q, k, v = (t.float().numpy() for t in (q, k, v))
    B, H, L, D = q.shape
    out = np.empty((B, H, L, D), F16)
    cols = softmax_columns(L)                       # [steps, 32, 8]
    steps = cols.shape[0]
    rows = np.arange(L)
    n = rows + 1 if causal else np.full(L, L)
    for b in range(B):
        for h in range(H):
            S = (q[b, h].astype(F64) @ k[b, h].astype(F64).T).astype(F16)  # GEMM 1: fp16 output
            x = (S.astype(F32) * F32(scale)).astype(F32)
            seen = cols[None] < n[:, None, None, None]                      # [row, step, lane, e]
            X = np.where(seen, x[rows[:, None, None, None], np.minimum(cols, L - 1)[None]], NEG_INF)
            m = np.full((L, 32), NEG_INF)
            l = np.zeros((L, 32), F32)
            for it in range(steps):                    # pass 1: per-lane online (m, l), 8 at a time
                live = it * 32 * SOFTMAX_VEC < n
                xs = X[:, it]
                m_new = np.maximum(m, xs.max(-1))
                l_new = (l * safe_exp_diff(m, m_new)).astype(F32)
                for e in range(SOFTMAX_VEC):
                    l_new = (l_new + safe_exp_diff(xs[..., e], m_new)).astype(F32)
                m = np.where(live[:, None], m_new, m)
                l = np.where(live[:, None], l_new, l)
            row_max = warp_max(m)
            row_sum = warp_sum((l * safe_exp_diff(m, row_max)).astype(F32))
            inv = (F32(1) / row_sum).astype(F32)
            p = (safe_exp_diff(X, row_max[:, None, :, None]) * inv[:, None, :, None]).astype(F16)
            P = np.full((L, L), np.nan, F16)           # pass 2 writes every column < L
            inside = cols < L
            P[:, cols[inside]] = p[:, inside]
            assert not np.isnan(P).any()
            out[b, h] = (P.astype(F64) @ v[b, h].astype(F64)).astype(F16)  # GEMM 2
    return torch.from_numpy(out)


# ---- the pass rule on the models ----------------------------------------------------------------------

SHAPES = [Shape(1, 2, 1, 64), Shape(1, 2, 17, 64), Shape(1, 1, 333, 40), Shape(1, 1, 333, 64),
          Shape(1, 1, 70, 128)]


def assert_pass(model, shape, causal, seed=0, **kw):
    q, k, v = make_inputs(shape, seed=seed, device="cpu")
    ref = reference_attention(q, k, v, causal)
    fp16_err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
    verdict = judge(model(q, k, v, causal, shape.D ** -0.5, **kw), ref, fp16_err)
    assert verdict.passed, verdict.reason
    return verdict


@pytest.mark.parametrize("shape", SHAPES + [Shape(1, 1, 65, 1), Shape(1, 1, 129, 96)], ids=lambda s: s.label())
@pytest.mark.parametrize("causal", [False, True])
def test_model_02_meets_pass_rule(shape, causal):
    assert_pass(model_02, shape, causal)


@pytest.mark.parametrize("shape", SHAPES + [Shape(1, 1, 129, 96), Shape(1, 1, 300, 8)], ids=lambda s: s.label())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("warps", [4, 8])
def test_model_03_meets_pass_rule(shape, causal, warps):
    assert_pass(model_03, shape, causal, warps=warps)


@pytest.mark.parametrize("shape", SHAPES + [Shape(1, 1, 256, 64), Shape(1, 1, 520, 16), Shape(1, 1, 65, 1)],
                         ids=lambda s: s.label())
@pytest.mark.parametrize("causal", [False, True])
def test_model_04_meets_pass_rule(shape, causal):
    assert_pass(model_04, shape, causal)


def test_model_04_uses_both_column_layouts():
    """L % 8 == 0 takes 16-byte vectors, other L 2-byte loads; both cover each column once."""
    for L in (1, 17, 256, 333, 520):
        cols = softmax_columns(L)
        inside = np.sort(cols[cols < L])
        assert np.array_equal(inside, np.arange(L))


# ---- warp reductions: the butterfly and the earlier study's two bugs ---------------------------------

def reduce_mixing_rows(values, width):
    """Bug 1: a butterfly over the whole warp although each row owns only `width` lanes."""
    return warp_sum(values, 32)


def reduce_twice(values, width):
    """Bug 2: a reduction of a value the group already shares (width copies of it)."""
    return warp_sum(warp_sum(values, width), width)


def group_dot_lanes(a, b, width, reduce=warp_sum):
    """attn_test_group_dot of kernels/test_warp_reduce.cu: every lane's copy of its row's dot."""
    rows, D = a.shape
    partial = np.zeros((rows, width, 1), F32)
    for c in range(width):
        for e in range(c * 8, min(D, c * 8 + 8)):
            partial[:, c, 0] = fma32(a[:, e], b[:, e], partial[:, c, 0])
    per_warp = 32 // width
    warps = -(-rows // per_warp)
    lanes = np.zeros((warps * per_warp, width), F32)
    lanes[:rows] = partial[:, :, 0]
    return reduce(lanes.reshape(warps, 32), width).reshape(-1, width)[:rows]


def check_group_dots(lanes_out, a, b):
    """The assertion the GPU test applies too: every lane of each row holds that row's dot product."""
    expect = (a.astype(F64) * b.astype(F64)).sum(1)
    err = np.abs(lanes_out.astype(F64) - expect[:, None])
    tol = 1e-5 * (np.abs(a.astype(F64)) * np.abs(b.astype(F64))).sum(1)[:, None] + 1e-6
    assert (err <= tol).all(), f"{int((err > tol).sum())} lane results off; worst {err.max():.3g}"


def check_group_reduce(x, sums, maxes, width):
    """The assertion for attn_test_warp_reduce: each lane holds its own group's sum and max."""
    groups = x.reshape(-1, width).astype(F64)
    expect_sum = np.repeat(groups.sum(1), width)
    expect_max = np.repeat(groups.max(1), width)
    assert np.allclose(sums, expect_sum, rtol=1e-5, atol=1e-5), "group sums wrong"
    assert np.array_equal(maxes, expect_max.astype(F32)), "group maxima wrong"


def dot_inputs(rows, D, seed=0):
    gen = np.random.default_rng(seed)
    a = (gen.standard_normal((rows, D)) + 0.5).astype(F16).astype(F32)
    b = (gen.standard_normal((rows, D)) + 0.5).astype(F16).astype(F32)
    return a, b


@pytest.mark.parametrize("D", [8, 40, 64, 128])
def test_butterfly_group_dot_is_right(D):
    width = registry.ch03_warp_reductions.lanes_per_row(D)
    a, b = dot_inputs(37, D)
    check_group_dots(group_dot_lanes(a, b, width), a, b)


@pytest.mark.parametrize("D", [40, 64, 128])
@pytest.mark.parametrize("bug", [reduce_mixing_rows, reduce_twice], ids=lambda f: f.__name__)
def test_the_study_reduction_bugs_fail_the_same_assertion(D, bug):
    width = registry.ch03_warp_reductions.lanes_per_row(D)
    a, b = dot_inputs(37, D)
    with pytest.raises(AssertionError):
        check_group_dots(group_dot_lanes(a, b, width, reduce=bug), a, b)


@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
def test_butterfly_reduces_within_groups(width):
    x = np.random.default_rng(1).standard_normal(128).astype(F32)
    lanes = x.reshape(-1, 32)
    check_group_reduce(x, warp_sum(lanes, width).ravel(), warp_max(lanes, width).ravel(), width)
    if width < 32:
        with pytest.raises(AssertionError):
            check_group_reduce(x, warp_sum(lanes, 32).ravel(), warp_max(lanes, 32).ravel(), width)


@pytest.mark.parametrize("bug", [reduce_mixing_rows, reduce_twice], ids=lambda f: f.__name__)
def test_the_study_reduction_bugs_fail_the_pass_rule_in_kernel_03(bug):
    # L = 17 puts several rows in each warp; at L = 1 a warp holds one row and bug 1 adds only zeros.
    with pytest.raises(AssertionError):
        assert_pass(model_03, Shape(1, 2, 17, 64), False, reduce=bug)


# ---- the same assertions on hardware ------------------------------------------------------------------

def _test_module():
    """kernels/test_warp_reduce.cu built for this GPU (nvcc where present, else NVRTC)."""
    import cupy

    from attnlab.kernels import compile as build
    from attnlab.kernels import toolchain

    path = kernels_dir() / "test_warp_reduce.cu"
    if build.backend() == "nvcc":
        major, minor = torch.cuda.get_device_capability()
        spec = registry.KernelSpec(id="test_warp_reduce", chapter=0, title="warp reductions",
                                   source=path.name, entry="attn_test_warp_reduce",
                                   block=lambda s: (32, 1, 1), grid=lambda s: (1, 1, 1))
        cubin, _ = build.nvcc_cubin(spec, f"sm_{major}{minor}")
        return cupy.RawModule(path=str(cubin))
    options = ("-std=c++17", f"--include-path={kernels_dir()}",
               *(f"--include-path={d}" for d in toolchain.include_dirs()))
    return cupy.RawModule(code=path.read_text(), options=options)


@pytest.mark.gpu
@pytest.mark.parametrize("width", [1, 2, 4, 8, 16, 32])
def test_gpu_warp_reduce(width):
    import cupy

    fn = _test_module().get_function("attn_test_warp_reduce")
    x = np.random.default_rng(1).standard_normal(256).astype(F32)
    dx = cupy.asarray(x)
    sums, maxes = cupy.full(256, np.nan, F32), cupy.full(256, np.nan, F32)
    fn((2,), (128,), (dx, sums, maxes, np.int32(256), np.int32(width)))
    check_group_reduce(x, cupy.asnumpy(sums), cupy.asnumpy(maxes), width)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [8, 40, 64, 128])
def test_gpu_group_dot(D):
    import cupy

    fn = _test_module().get_function("attn_test_group_dot")
    width = registry.ch03_warp_reductions.lanes_per_row(D)
    rows = 37
    a, b = dot_inputs(rows, D)
    out = cupy.full(rows * width, np.nan, F32)
    threads = rows * width
    fn((-(-threads // 128),), (128,), (cupy.asarray(a.astype(F16)), cupy.asarray(b.astype(F16)), out,
                                       np.int32(rows), np.int32(D), np.int32(width)))
    check_group_dots(cupy.asnumpy(out).reshape(rows, width), a, b)
