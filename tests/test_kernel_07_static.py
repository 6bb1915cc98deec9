"""Chapter 7 without a GPU: what ptxas and the SASS say about kernels/07_mma_swizzle.cu.

One build per architecture (sm_80, sm_89, sm_90) holds all six entries (D = 64 and 128, for the
kernel and its two ablations). For each entry: no spill, shared memory within the L4's 99 KB,
registers that allow the two CTAs per SM the tiles are sized for, and the instruction mix the
design promises (tensor-core MMAs, ldmatrix and its transposing form for V, 16-byte cp.async,
quad shuffles, exp2 on the SFU, 16-byte stores), counted per loop body. The ablations must differ
from the kernel only as intended. The registry's launch constants are read back from the source.
"""
from __future__ import annotations

import re

import pytest

from attnlab import registry
from attnlab.registry import L4_MAX_SMEM_PER_BLOCK
from attnlab.shapes import Shape
from attnlab.static import ARCHES, function_opcodes, parse_ptxas, sass_by_function
from attnlab.static import build as static_build

IDS = ("07_mma", "07_mma_noswizzle", "07_mma_single_buffer")
SPEC = registry.get("07_mma")
SRC = SPEC.path.read_text()
MAX_REGS_PER_SM = 65536


def _const(name: str) -> int:
    return int(re.search(rf"constexpr int {name} = (\d+);", SRC).group(1))


WARPS, MIN_CTAS = _const("WARPS"), _const("MIN_CTAS_PER_SM")
THREADS, BLOCK_M = 32 * WARPS, 16 * WARPS
BLOCK_N = {64: _const("BLOCK_N_D64"), 128: _const("BLOCK_N_D128")}


def _entries() -> dict[str, tuple[int, bool, bool]]:
    """entry -> (D, swizzle, double buffer), from the extern "C" definitions."""
    found = re.findall(r'extern "C" __global__ void __launch_bounds__\(THREADS, MIN_CTAS_PER_SM\)\s*'
                       r'(attn_fwd_07_\w+)\(.*?attn_fwd_07<(\d+), \w+, (true|false), (true|false)>', SRC, re.S)
    return {name: (int(d), sw == "true", db == "true") for name, d, sw, db in found}


ENTRIES = _entries()


def _smem(D: int, double_buf: bool) -> int:
    return 2 * D * (BLOCK_M + (2 if double_buf else 1) * 2 * BLOCK_N[D])


@pytest.fixture(scope="module", params=ARCHES)
def build(request):
    arch = request.param
    b = static_build(SPEC, arch)
    return arch, {f.name: f for f in parse_ptxas(b.ptxas)}, sass_by_function(b.sass)


_opcodes = function_opcodes


def test_registry_names_every_entry_with_its_head_dim():
    assert len(ENTRIES) == 6
    named = set()
    for kid in IDS:
        spec = registry.get(kid)
        assert spec.chapter == 7 and spec.head_dims == frozenset({64, 128}) and spec.alignment == 16
        assert "swizzle.cuh" in spec.extra_sources
        assert spec.entry == spec.entry_for(64)
        for D in (64, 128):
            entry = spec.entry_for(D)
            assert ENTRIES[entry][0] == D
            named.add(entry)
        if kid != "07_mma":
            assert "ablation" in spec.summary
    assert named == set(ENTRIES)


@pytest.mark.parametrize("kid", IDS)
def test_registry_mirrors_the_kernel_constants(kid):
    spec = registry.get(kid)
    for D in (64, 128):
        for L in (1, 17, 64, 65, 4096):
            shape = Shape(2, 3, L, D)
            _, sw, db = ENTRIES[spec.entry_for(D)]
            assert spec.block(shape) == (THREADS, 1, 1)
            assert spec.grid(shape) == (-(-L // BLOCK_M), 6, 1)
            assert spec.dynamic_smem(shape) == _smem(D, db) <= L4_MAX_SMEM_PER_BLOCK
    assert registry._MMA07_WARPS == WARPS and registry._MMA07_BLOCK_N == BLOCK_N


def test_resources_no_spill_smem_and_two_ctas_per_sm(build):
    arch, resources, _ = build
    assert set(resources) == set(ENTRIES)
    for name, (D, _, db) in ENTRIES.items():
        f = resources[name]
        assert not f.spills and f.stack_bytes == 0, f"{name} on {arch}: {f}"
        assert f.static_smem + _smem(D, db) <= L4_MAX_SMEM_PER_BLOCK
        # the register file must hold MIN_CTAS_PER_SM CTAs (allocation: 8 registers per thread)
        assert MIN_CTAS * THREADS * (-(-f.registers // 8) * 8) <= MAX_REGS_PER_SM, f"{name}: {f.registers} regs"


def _expected(D: int) -> dict[str, int]:
    """Per-thread instruction counts of one build, with the loop body compiled once."""
    bn = BLOCK_N[D]
    q_copies, kv_copies = BLOCK_M * D // 8 // THREADS, bn * D // 8 // THREADS
    return {
        "HMMA.16816.F32": (D // 16) * (bn // 8) + (bn // 16) * (D // 8),  # S = Q K^T, then O += P V
        "LDSM.16.M88.4": D // 16 + (D // 16) * (bn // 16),                 # Q once, K per tile
        "LDSM.16.MT88.4": (bn // 16) * (D // 16),                          # V, transposed
        "LDGSTS.E.BYPASS.128": q_copies + 2 * kv_copies + 2 * kv_copies,   # prologue Q, K0, V0; loop K, V
        "SHFL.BFLY": 4 + 4,                                                # max and sum, 2 rows x (xor 1, 2)
        "MUFU.EX2": (bn // 8) * 4 + 2,                                     # p per score, 2 corrections
        "STG.E.128": 16 * D // 8 // 32,                                    # 16-byte output stores
    }


def test_sass_has_the_promised_instruction_mix(build):
    arch, _, sass = build
    for name, (D, _, _) in ENTRIES.items():
        ops = _opcodes(sass[name])
        for op, n in _expected(D).items():
            assert ops[op] == n, f"{name} on {arch}: {op} x{ops[op]}, expected {n}"
        assert not any(op.startswith(("LDL", "STL")) for op in ops), f"{name}: local memory"
        assert not any(op.startswith("STG") and op != "STG.E.128" for op in ops), f"{name}: narrow stores"
        assert not any(op.split(".")[0] == "LDG" for op in ops), f"{name}: loads that bypass cp.async"


def test_ablations_differ_only_as_intended(build):
    arch, _, sass = build
    core = ("HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128", "SHFL.BFLY", "MUFU.EX2",
            "STG.E.128", "F2FP.F16.F32.PACK_AB")
    for D in (64, 128):
        main = sass[f"attn_fwd_07_mma_d{D}"]
        plain = sass[f"attn_fwd_07_mma_noswizzle_d{D}"]
        single = sass[f"attn_fwd_07_mma_single_buffer_d{D}"]
        om, op_, os_ = _opcodes(main), _opcodes(plain), _opcodes(single)
        for op in core:
            assert om[op] == op_[op] == os_[op], f"{arch} D={D}: {op} {om[op]} / {op_[op]} / {os_[op]}"
        # The swizzle is integer XORs on addresses: the unswizzled build has fewer LOP3s.
        assert op_["LOP3.LUT"] < om["LOP3.LUT"]
        # Double buffer: one cp.async group may stay in flight (wait_group 1); single: none.
        waits = lambda lines: sorted(l for l in lines if l.startswith("DEPBAR"))  # noqa: E731
        assert waits(main) == waits(plain) == ["DEPBAR.LE SB0, 0x1"]
        assert waits(single) == ["DEPBAR.LE SB0, 0x0"]
        for lines in (main, plain, single):
            assert sum(l.startswith("BAR.SYNC") for l in lines) == 2  # tile landed; stage free
