"""Chapter 7 without a GPU: what ptxas and the SASS say about kernels/07_mma_swizzle.cu.

One build per architecture (sm_80, sm_89, sm_90), with the tiles the registry gives that
architecture (64-key tiles at D = 128 on sm_80 and sm_90, the source's 32 on sm_89; three K/V
stages at both head dims on sm_90, the source's two elsewhere), holds every
entry (D = 64 and 128, for the kernel, its key splits and its ablations). For each entry the
architecture runs: no spill, shared memory within one block's limit there, two CTAs per SM by
shared memory and by registers, and the instruction mix the design promises (tensor-core MMAs,
ldmatrix and its transposing form for V, 16-byte cp.async, quad shuffles, exp2 on the SFU,
16-byte stores), counted per loop body. The ablations must differ from the kernel only as
intended. The registry's launch constants are read back from the source.
"""
from __future__ import annotations

import re

import pytest

from attnlab.kernels import registry
from attnlab.gpus import SM_LIMITS, occupancy
from attnlab.shapes import Shape
from attnlab.kernels.static import ARCHES, function_opcodes, main_path, parse_ptxas, sass_by_function
from attnlab.kernels.static import build as static_build

IDS = ("07_mma", "07_mma_split2", "07_mma_split4", "07_mma_nosplit", "07_mma_two_barriers", "07_mma_noswizzle",
       "07_mma_single_buffer", "07_mma_longest_first", "07_mma_plain", "07_mma_two_row_blocks", "07_mma_across_heads",
       "07_mma_rows_that_fill", "07_mma_even_split", "07_mma_lean", "07_mma_lean_across_heads", "07_mma_lean_loop",
       "07_mma_whole_tiles", "07_mma_whole_tiles_across_heads", "07_mma_whole_tile_copy", "07_mma_deferred_pv",
       "07_mma_deferred_pv_across_heads", "07_mma_pv_a_tile_later", "07_mma_deferred_pv_two_rows", "07_mma_q_from_tile",
       "07_mma_two_rows_at_d128")
SPEC = registry.KERNELS["07_mma"]  # the source's own tiles (the L4's)
SRC = SPEC.path.read_text()
MAX_REGS_PER_SM = 65536


def _const(name: str) -> int:
    return int(re.search(rf"constexpr int {name} = (\d+);", SRC).group(1))


WARPS, MIN_CTAS = _const("WARPS"), _const("MIN_CTAS_PER_SM")
THREADS, BLOCK_M = 32 * WARPS, 16 * WARPS
BLOCK_N = {64: _const("BLOCK_N_D64"), 128: _const("BLOCK_N_D128")}  # what the file compiles to on its own


STAGES = {64: _const("STAGES_D64"), 128: _const("STAGES_D128")}


def block_n(spec) -> dict[int, int]:
    """The key tiles of a build of `spec` (its architecture's, or the source's)."""
    return {D: spec.config[f"ATTN07_BLOCK_N_D{D}"] for D in (64, 128)}


def stages(spec) -> dict[int, int]:
    """The K/V stages of a build of `spec` per head dim."""
    return {D: spec.config[f"ATTN07_STAGES_D{D}"] for D in (64, 128)}


def _entries() -> dict[str, tuple[int, int, bool, int | None, bool, int, bool, bool, bool, bool]]:
    """entry -> (D, key split, swizzle, stages (None: the build's STAGES_D<D>), one barrier, 16-row
    blocks per warp, causal tiles across the heads, whole-tile copy, skipped rescale, O += P V a
    tile later), from the ATTN07_ENTRY lines."""
    assert re.search(r"extern \"C\" __global__ void __launch_bounds__\(THREADS, MIN_CTAS_PER_SM\)", SRC)
    found = re.findall(r"^ATTN07_ENTRY\((attn_fwd_07_\w+), (\d+), BLOCK_N_D\2(?:_TWO_ROWS)?, (\d+), (true|false), "
                       r"(STAGES_D\2|1), (true|false), (?:true|false), ([12]), (true|false), (true|false), (true|false), "
                       r"(true|false)\)$",
                       SRC, re.M)
    assert len(found) == SRC.count("\nATTN07_ENTRY(")
    return {name: (int(d), int(split), sw == "true", None if st.startswith("STAGES") else int(st), ob == "true", int(rb),
                   across == "true", whole == "true", skip == "true", defer == "true")
            for name, d, split, sw, st, ob, rb, across, whole, skip, defer in found}


def entry_stages(entry: str, st: dict) -> int:
    """The K/V stages `entry` has in a build whose stages per head dim are `st`."""
    D, fixed = ENTRIES[entry][0], ENTRIES[entry][3]
    return st[D] if fixed is None else fixed


ENTRIES = _entries()
# The two-row entries at D = 128 (07_mma_q_from_tile's) take their own key tile on every GPU
# (BLOCK_N_D128_TWO_ROWS).
OWN_TILE = {name: _const(f"BLOCK_N_D{d}_TWO_ROWS")
            for name, d in re.findall(r"^ATTN07_ENTRY\((attn_fwd_07_\w+), (\d+), BLOCK_N_D\2_TWO_ROWS,", SRC, re.M)}


def entry_tiles(entry: str, bn: dict) -> dict:
    """The key tiles per head dim `entry` runs with in a build whose tiles are `bn`."""
    return {**bn, ENTRIES[entry][0]: OWN_TILE[entry]} if entry in OWN_TILE else bn
# FlashAttention-2's route (07_mma_split_ctas): partial entry -> D, and the combine kernel.
PARTIALS = {name: int(d) for name, d in re.findall(r"^ATTN07_PARTIAL_ENTRY\((attn_fwd_07_mma_partial_d(\d+)), \2, "
                                                    r"BLOCK_N_D\2, STAGES_D\2\)$", SRC, re.M)}
COMBINE = "attn_combine_07"


def _smem(D: int, n_stages: int, split: int = 1, bn: dict | None = None, rb: int = 1) -> int:
    return 2 * D * (BLOCK_M * rb // split + n_stages * 2 * (bn or BLOCK_N)[D])


def _partials(D: int, split: int, rb: int) -> int:
    """Q, then the key split's merge partials where they outgrow the K/V stages (two row blocks at
    D = 128 with 32-key tiles): (split - 1) x warps per group x rb x 32 lanes x (D/2 + 4) floats."""
    return 2 * D * BLOCK_M * rb // split + (split - 1) * (WARPS // split) * rb * 32 * (D // 2 + 4) * 4


def _runs(entry: str, bn: dict) -> bool:
    """Whether the launcher may run `entry` with key tiles `bn` (split_fits: whole 16-key slices);
    a split entry whose slice is not whole compiles to nothing."""
    D, split = ENTRIES[entry][:2]
    n = entry_tiles(entry, bn)[D]
    return n % split == 0 and (n // split) % 16 == 0


def _built(kernel_id: str, arch: str, config: dict | None = None):
    """(arch, ptxas's resources and SASS per function, key tiles, stages) of `kernel_id` built for
    `arch` (with `config` over its tiles there)."""
    spec = registry.get(kernel_id, arch).with_config(config or {})
    b = static_build(spec, arch)
    return arch, {f.name: f for f in parse_ptxas(b.ptxas)}, sass_by_function(b.sass), block_n(spec), stages(spec)


@pytest.fixture(scope="module", params=ARCHES)
def build(request):
    return _built("07_mma", request.param)


@pytest.fixture(scope="module", params=ARCHES)
def cta_split_build(request):
    """FlashAttention-2's route (07_mma_split_ctas), whose tiles may differ on sm_80."""
    return _built("07_mma_split_ctas", request.param)


def test_the_key_tile_and_the_stages_follow_the_shared_memory_of_each_architecture():
    """The largest tile (up to 64 keys) that lets MIN_CTAS_PER_SM CTAs share an SM, then the most
    stages (up to 3) that keep as many CTAs per SM as two stages do."""
    assert {a: block_n(registry.get("07_mma", a))[128] for a in ARCHES} == {"sm_80": 64, "sm_89": 32, "sm_90": 64}
    assert {a: stages(registry.get("07_mma", a)) for a in ARCHES} == {
        "sm_80": STAGES, "sm_89": STAGES, "sm_90": {64: 3, 128: 3}}
    assert STAGES == {64: 2, 128: 2} and registry.ch07_mma.STAGES == STAGES
    sm_86 = registry.get("07_mma", "sm_86")
    assert block_n(sm_86)[128] == 32 and stages(sm_86) == STAGES
    for arch in SM_LIMITS:
        spec = registry.get("07_mma", arch)
        bn, st = block_n(spec), stages(spec)
        regs = registry.ch07_mma.REGISTERS
        for D in (64, 128):
            smem = spec.dynamic_smem(Shape(1, 1, 4096, D))
            assert smem == _smem(D, st[D], 1, bn) <= SM_LIMITS[arch].smem_per_block
            ctas = occupancy(arch, THREADS, regs[D], smem).blocks_per_sm
            two_stages = occupancy(arch, THREADS, regs[D], _smem(D, STAGES[D], 1, bn)).blocks_per_sm
            assert ctas >= MIN_CTAS and ctas == two_stages, (arch, D)
            if bn[D] < registry.ch07_mma.MAX_BLOCK_N:  # the next tile up would leave one CTA per SM
                assert occupancy(arch, THREADS, 0, _smem(D, STAGES[D], 1, {D: 2 * bn[D]})).blocks_per_sm < MIN_CTAS
            if st[D] < registry.ch07_mma.MAX_STAGES:  # one more stage would cost a CTA (or not fit)
                more = _smem(D, st[D] + 1, 1, bn)
                assert (more > SM_LIMITS[arch].smem_per_block
                        or occupancy(arch, THREADS, regs[D], more).blocks_per_sm < max(MIN_CTAS, two_stages))
    # the A100's case: a third stage at D = 64 fits two CTAs but not the three its registers allow
    assert occupancy("sm_80", THREADS, regs[64], _smem(64, 3)).blocks_per_sm == 2
    assert occupancy("sm_80", THREADS, regs[64], _smem(64, 2)).blocks_per_sm == 3
    # every chapter-7 id takes the kernel's tiles (FA2's route less where its partial spills, below)
    for kid in IDS:
        spec = registry.get(kid, "sm_90")
        assert block_n(spec) == {64: 64, 128: 64} and stages(spec) == {64: 3, 128: 3}
    assert registry.get("07_mma", "sm_90").config_label() == "default"  # the chapter's own configuration there


def test_fa2_route_takes_less_only_where_its_partial_spills_with_the_kernels_tiles(build):
    """At the kernel's tiles the partial kernel runs out of registers at D = 128 on sm_80 (64 keys)
    and sm_90 (3 stages): the registry names the exceptions, and this build shows each is still
    needed (drop one when its spill is gone)."""
    arch, resources, _, bn, st = build
    spec = registry.get("07_mma_split_ctas", arch)
    spills = resources["attn_fwd_07_mma_partial_d128"].spills
    assert spills == (arch in registry.ch07_mma.PARTIAL_TOPS)
    if spills:
        top_bn, top_st = registry.ch07_mma.PARTIAL_TOPS[arch]
        assert (block_n(spec), stages(spec)) != (bn, st)
        assert all(block_n(spec)[D] == min(top, bn[D]) for D, top in top_bn.items())
        assert all(stages(spec)[D] == min(top, st[D]) for D, top in top_st.items())
        # never more than the kernel's, and D = 64 exactly the kernel's
        assert all(block_n(spec)[D] <= bn[D] and stages(spec)[D] <= st[D] for D in (64, 128))
        assert block_n(spec)[64] == bn[64] and stages(spec)[64] == st[64]
    else:
        assert (block_n(spec), stages(spec)) == (bn, st)
    assert stages(registry.get("07_mma_split_ctas", "sm_80")) == STAGES  # a smaller tile adds no stage


def _opcodes(lines: list[str]):
    """Opcode counts of the path a converged warp runs (static.main_path: the divergence fallback
    ptxas appends after EXIT, behind the one-barrier loop's shuffles, is left out)."""
    return function_opcodes(main_path(lines))


def test_registry_names_every_entry_with_its_head_dim():
    assert len(ENTRIES) == 63 and set(OWN_TILE) == {"attn_fwd_07_mma_q_from_tile_d128",
                                                    "attn_fwd_07_mma_q_from_tile_split2_d128"}
    named = {arch: set() for arch in ARCHES}
    for arch in ARCHES:
        for kid in IDS:
            spec = registry.get(kid, arch)
            assert spec.chapter == 7 and spec.alignment == 16 and "swizzle.cuh" in spec.extra_sources
            assert spec.entry == spec.entry_for(min(spec.head_dims))
            for D in sorted(spec.head_dims):
                for entry in spec.entries_at_head_dim(D):
                    assert ENTRIES[entry][0] == D and _runs(entry, block_n(spec))
                    named[arch].add(entry)
            if kid not in ("07_mma", "07_mma_split2", "07_mma_split4", "07_mma_two_row_blocks", "07_mma_across_heads",
                           "07_mma_rows_that_fill", "07_mma_even_split", "07_mma_lean", "07_mma_lean_across_heads",
                           "07_mma_lean_loop", "07_mma_whole_tiles", "07_mma_whole_tiles_across_heads",
                           "07_mma_whole_tile_copy", "07_mma_deferred_pv", "07_mma_deferred_pv_across_heads",
                           "07_mma_pv_a_tile_later", "07_mma_q_from_tile"):
                assert "ablation" in spec.summary and spec.variant_of == "07_mma"
    # every entry runs somewhere; the 4-way split at D = 128 only with 64-key tiles
    assert named["sm_90"] == named["sm_80"] == set(ENTRIES)
    assert named["sm_89"] == set(ENTRIES) - {f"attn_fwd_07_mma{kind}_split4_d128"
                                             for kind in ("", "_across_heads", "_lean", "_lean_across_heads",
                                                          "_whole_tiles", "_whole_tiles_across_heads",
                                                          "_deferred_pv", "_deferred_pv_across_heads")}
    # the kernel may run every split entry; each fixed-split variant runs only its own
    assert set(registry.get("07_mma").entries_at_head_dim(64)) == {e for e, v in ENTRIES.items()
                                                                   if v[0] == 64 and v[2:] == (True, None, True, 1, False, False, False, False)}
    # step 7.7 takes two row blocks at D = 64 in every split, and 07_mma's entries at D = 128
    step = registry.get("07_mma_two_row_blocks")
    assert {ENTRIES[e][5] for e in step.entries_at_head_dim(64)} == {2}
    assert set(step.entries_at_head_dim(128)) == set(registry.get("07_mma").entries_at_head_dim(128))
    # step 7.8 is step 7.7 with its causal tiles across the heads, at both head dims
    after = registry.get("07_mma_across_heads")
    for D in (64, 128):
        ours = after.entries_at_head_dim(D)
        assert all(ENTRIES[e][6] for e in ours)
        assert [ENTRIES[e][:6] for e in ours] == [ENTRIES[e][:6] for e in step.entries_at_head_dim(D)]
    # steps 7.9 and 7.10 run step 7.6's entries and step 7.8's, and none of their own
    for kid in ("07_mma_rows_that_fill", "07_mma_even_split"):
        fits = registry.get(kid)
        for D in (64, 128):
            assert set(fits.entries_at_head_dim(D)) == set(registry.get("07_mma").entries_at_head_dim(D)) | set(
                after.entries_at_head_dim(D))
    # step 7.11 runs step 7.10's entries with both switches of the lean loop, step 7.12 with the copy's alone,
    # step 7.13 with the copy's and O += P V a tile later, but for its two row blocks (D = 64): step 7.12's
    ten, lean, whole, later = (registry.get(k) for k in ("07_mma_even_split", "07_mma_lean_loop",
                                                         "07_mma_whole_tile_copy", "07_mma_pv_a_tile_later"))
    for D in (64, 128):
        for step, switches in ((ten, (False, False, False)), (lean, (True, True, False)), (whole, (True, False, False)),
                               (later, (True, False, True))):
            assert [ENTRIES[e][:7] for e in step.entries_at_head_dim(D)] == [ENTRIES[e][:7]
                                                                             for e in ten.entries_at_head_dim(D)]
            for e in step.entries_at_head_dim(D):
                two_rows_kept = step is later and ENTRIES[e][5] == 2
                assert ENTRIES[e][7:] == ((True, False, False) if two_rows_kept else switches), e
    assert {e for e in later.entries_at_head_dim(64) if ENTRIES[e][5] == 2} == {
        e for e in whole.entries_at_head_dim(64) if ENTRIES[e][5] == 2} != set()
    # and its ablation takes the deferral to those two row blocks, its D = 128 entries being step 7.13's
    ablation = registry.get("07_mma_deferred_pv_two_rows")
    assert {ENTRIES[e][5:] for e in ablation.entries_at_head_dim(64)} == {(2, True, True, False, True)}
    assert set(ablation.entries_at_head_dim(128)) == set(registry.get("07_mma_deferred_pv_across_heads").entries_at_head_dim(128))
    # the ablation 07_mma_two_rows_at_d128 runs step 7.13's entries but at D = 128 with two row blocks:
    # there step 7.12's two-row loop with two row blocks (unsplit and split in two: a 32-key tile
    # splits no further)
    fourteen = registry.get("07_mma_two_rows_at_d128")
    assert set(fourteen.entries_at_head_dim(64)) == set(later.entries_at_head_dim(64))
    two_rows = {e for e in fourteen.entries_at_head_dim(128) if ENTRIES[e][5] == 2}
    assert two_rows == set(OWN_TILE)
    assert {e for e in fourteen.entries_at_head_dim(128) if e not in two_rows} == set(
        registry.get("07_mma_deferred_pv").entries_at_head_dim(128))
    assert {ENTRIES[e][1:] for e in two_rows} == {(s, True, None, True, 2, True, True, False, False) for s in (1, 2)}


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("kid", IDS)
def test_registry_mirrors_the_kernel_constants(kid, arch):
    spec = registry.get(kid, arch)
    bn = block_n(spec)
    for D in sorted(spec.head_dims):
        for L in (1, 17, 64, 65, 4096):
            shape = Shape(2, 3, L, D)
            cfg = spec.launch_config(shape)
            split, rb = ENTRIES[cfg["entry"]][1], ENTRIES[cfg["entry"]][5]
            assert cfg["kv_split"] == split and _runs(cfg["entry"], bn)
            assert spec.block(shape) == (THREADS, 1, 1)
            assert spec.grid(shape) == (-(-L // (BLOCK_M * rb // split)), 6, 1)
            n_stages = entry_stages(cfg["entry"], stages(spec))
            assert spec.dynamic_smem(shape) == max(_smem(D, n_stages, split, entry_tiles(cfg["entry"], bn), rb),
                                                   _partials(D, split, rb)) <= SM_LIMITS[arch].smem_per_block
    assert registry.ch07_mma.WARPS == WARPS and registry.ch07_mma.BLOCK_N == BLOCK_N
    # the fixed split of 4 runs D = 128 only where the tile is 64 keys (16 per group)
    if kid == "07_mma_split4":
        assert spec.supports_head_dim(128) == (bn[128] == 64)


def test_resources_no_spill_smem_and_two_ctas_per_sm(build):
    arch, resources, _, bn, st = build
    assert set(resources) == set(ENTRIES) | set(PARTIALS) | {COMBINE}
    for name, (D, split, *_rest, rb, _across, _whole, _skip, _defer) in ENTRIES.items():
        if not _runs(name, bn):
            continue
        f = resources[name]
        assert not f.spills and f.stack_bytes == 0, f"{name} on {arch}: {f}"
        smem = f.static_smem + max(_smem(D, entry_stages(name, st), split, entry_tiles(name, bn), rb), _partials(D, split, rb))
        assert smem <= SM_LIMITS[arch].smem_per_block
        # Two CTAs per SM, but for the two-row entries at D = 128 on the 100 KB of an sm_89 SM,
        # where their 128-row Q tile leaves room for one (the registers would hold two)
        one_by_smem = name in OWN_TILE and arch == "sm_89"
        ctas = occupancy(arch, THREADS, f.registers, smem).blocks_per_sm
        assert ctas == 1 if one_by_smem else ctas >= MIN_CTAS, f"{name} on {arch}: {ctas} CTAs"
        # the register file must hold MIN_CTAS_PER_SM CTAs (allocation: 8 registers per thread)
        assert MIN_CTAS * THREADS * (-(-f.registers // 8) * 8) <= MAX_REGS_PER_SM, f"{name}: {f.registers} regs"
        # and the bound the registry's choice of stages counts CTAs with holds
        bound = registry.ch07_mma.REGISTERS[D] if rb == 1 else registry.ch07_mma.TWO_ROWS_REGISTERS
        assert f.registers <= bound, f"{name} on {arch}: {f.registers} registers"


def _expected(D: int, split: int, tiles: dict, n_stages: int, rb: int = 1, whole: bool = False,
              defer: bool = False) -> dict[str, int]:
    """Per-thread instruction counts of one build, with the loop body compiled once. A warp
    multiplies its group's slice of each tile: SUB_N = BLOCK_N / split keys, for each of its rb
    16-row blocks, from K and V fragments read once for all of them. The prologue copies
    n_stages - 1 tiles ahead; the whole-tile copy has two of the loop's (a whole tile's, a ragged one's).
    O += P V a tile later (defer) has two copies of its code, in the loop and after it (the last
    tile's); its prologue copies the first tile's V alone, and its loop copies K and V each whole or
    ragged."""
    bn, sub_n = tiles[D], tiles[D] // split
    q_copies, kv_copies = BLOCK_M * rb // split * D // 8 // THREADS, bn * D // 8 // THREADS
    pv_copies = 2 if defer else 1
    copies = (n_stages - 1 + 1 + 4) * kv_copies if defer else (n_stages - 1 + 1 + whole) * 2 * kv_copies
    return {
        "HMMA.16816.F32": rb * ((D // 16) * (sub_n // 8) + pv_copies * (sub_n // 16) * (D // 8)),  # S = Q K^T, O += P V
        "LDSM.16.M88.4": rb * D // 16 + (D // 16) * (sub_n // 16),                    # Q once, K per tile
        "LDSM.16.MT88.4": pv_copies * (sub_n // 16) * (D // 16),                      # V, transposed
        "LDGSTS.E.BYPASS.128": q_copies + copies,                                     # prologue; loop K, V
        "SHFL.BFLY": rb * (4 + 4),  # 2 rows x (xor 1, 2): the max in the loop, the sum once after it (below)
        # p per score, 2 corrections; the merge: 2 rows x 2 factors per other group
        "MUFU.EX2": rb * ((sub_n // 8) * 4 + 2 + 4 * (split - 1)),
        "STG.E.128": rb * 16 * D // 8 // 32,                                          # 16-byte output stores
    }


def test_sass_has_the_promised_instruction_mix(build):
    arch, _, sass, bn, st = build
    for name, (D, split, *_rest, rb, _across, whole, _skip, defer) in ENTRIES.items():
        if not _runs(name, bn):
            continue
        ops = _opcodes(sass[name])
        for op, n in _expected(D, split, entry_tiles(name, bn), entry_stages(name, st), rb, whole, defer).items():
            assert ops[op] == n, f"{name} on {arch}: {op} x{ops[op]}, expected {n}"
        assert not any(op.startswith(("LDL", "STL")) for op in ops), f"{name}: local memory"
        assert not any(op.startswith("STG") and op != "STG.E.128" for op in ops), f"{name}: narrow stores"
        assert not any(op.split(".")[0] == "LDG" for op in ops), f"{name}: loads that bypass cp.async"


@pytest.mark.parametrize("arch", ARCHES)
def test_the_lean_loop_branches_around_the_rescale(arch):
    """Step 7.11 skips the rescale of O by a branch, not by predication: in the key-tile loop each of
    its 2 x row-block votes is followed by a branch on the vote's predicate (the first instruction
    the predicate guards), and no multiply is predicated. (Predicated, the skipped multiplies would still take issue slots,
    and the model's count of the trips they ran on would undercount them.) No other entry votes: step
    7.12's keep the copy and not the vote."""
    from attnlab.kernels import sass_loop

    spec = registry.get("07_mma_lean_loop", arch)
    sass, bn = static_build(spec, arch).sass, block_n(spec)
    lean = [n for n, v in ENTRIES.items() if v[8] and _runs(n, bn)]
    assert len(lean) >= 10
    for name in (n for n in ENTRIES if _runs(n, bn)):
        lines = sass_loop.listing(sass, name)
        body = [ins for _, ins in sass_loop.loop_body(lines, sass_loop.main_loop(lines, "HMMA"))]
        votes = [i for i, ins in enumerate(body) if ins.startswith("VOTE.ANY")]
        assert len(votes) == (2 * ENTRIES[name][5] if name in lean else 0), f"{name} on {arch}"
        for i in votes:
            pred = re.match(r"VOTE\.ANY (P\d)", body[i]).group(1)
            guarded = next(ins for ins in body[i + 1:] if re.match(rf"@!?{pred} ", ins))
            assert guarded.startswith(f"@!{pred} BRA "), f"{name} on {arch}: {guarded}"
        assert name not in lean or not [ins for ins in body if ins.startswith("@") and "FMUL" in ins], f"{name} on {arch}"


@pytest.mark.parametrize("arch", ARCHES)
def test_the_row_max_is_reduced_per_tile_and_the_row_sum_once(arch):
    """The key-tile loop (the backward branch around the MMAs, sass_loop.main_loop) holds four quad
    shuffles: the max of rows g and g+8, xor 1 and xor 2 each. Each lane keeps its own share of the
    row sum through the loop, so the sum's four shuffles run once, after it (quad_sum in the
    epilogue; in the partial kernel's too). Every MMA is in the loop, but for step 7.13's last
    O += P V after it, and so is every exp2 but the split merge's."""
    from attnlab.kernels.sass_loop import loop_split

    for kid in ("07_mma", "07_mma_split_ctas"):
        spec = registry.get(kid, arch)
        sass, bn = static_build(spec, arch).sass, block_n(spec)
        names = [n for n in ENTRIES if _runs(n, bn)] if kid == "07_mma" else list(PARTIALS)
        for name in names:
            D, split, rb = ((*ENTRIES[name][:2], ENTRIES[name][5]) if name in ENTRIES else (PARTIALS[name], 1, 1))
            inside, outside = loop_split(sass, name)
            assert (inside["SHFL.BFLY"], outside["SHFL.BFLY"]) == (4 * rb, 4 * rb), f"{name} on {arch}: {inside}, {outside}"
            sub_n = (entry_tiles(name, bn) if name in ENTRIES else bn)[D] // split
            last_pv = rb * (sub_n // 16) * (D // 8) if name in ENTRIES and ENTRIES[name][9] else 0
            assert outside["HMMA.16816.F32"] == last_pv and inside["HMMA.16816.F32"] > 0, f"{name} on {arch}"
            assert (inside["MUFU.EX2"], outside["MUFU.EX2"]) == (rb * (sub_n // 2 + 2), rb * 4 * (split - 1)), \
                f"{name} on {arch}"


def test_ablations_differ_only_as_intended(build):
    arch, _, sass, bn, st = build
    # (the copies differ by the stages the prologue fills: _expected holds each entry to its own)
    core = ("HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4", "SHFL.BFLY", "MUFU.EX2", "STG.E.128",
            "F2FP.F16.F32.PACK_AB")
    for D in (64, 128):
        om = _opcodes(sass[f"attn_fwd_07_mma_d{D}"])
        others = {kind: _opcodes(sass[f"attn_fwd_07_mma_{kind}_d{D}"])
                  for kind in ("noswizzle", "single_buffer", "two_barriers")}
        for op in core:
            assert all(o[op] == om[op] for o in others.values()), \
                f"{arch} D={D}: {op} {om[op]} / {[o[op] for o in others.values()]}"
        # The swizzle is integer XORs on addresses: the unswizzled build has fewer LOP3s.
        assert others["noswizzle"]["LOP3.LUT"] < om["LOP3.LUT"]
        # One block barrier per key tile in the loop against two: BAR.SYNC in the binary (the
        # loop body once). The split entries add the merge's two.
        assert om["BAR.SYNC.DEFER_BLOCKING"] == 1 and others["two_barriers"]["BAR.SYNC.DEFER_BLOCKING"] == 2
        assert others["single_buffer"]["BAR.SYNC.DEFER_BLOCKING"] == 2
    for name, (D, split, *_rest, defer) in ENTRIES.items():
        if split > 1 and _runs(name, bn):  # step 7.13's add one before the O += P V after the loop
            assert _opcodes(sass[name])["BAR.SYNC.DEFER_BLOCKING"] == 1 + 2 + defer, f"{name} on {arch}"
    for D in (64, 128):
        main, two, plain, single = (sass[f"attn_fwd_07_mma{kind}_d{D}"]
                                    for kind in ("", "_two_barriers", "_noswizzle", "_single_buffer"))
        # With one barrier the copy of tile j+STAGES-1 is issued after the wait for tile j, and the
        # STAGES-2 tiles after j may stay in flight: wait_group STAGES-2. With two it is issued
        # before, and STAGES-1 may: wait_group STAGES-1 (0 with one stage).
        waits = lambda lines: sorted(l for l in lines if l.startswith("DEPBAR"))  # noqa: E731
        assert waits(main) == waits(plain) == [f"DEPBAR.LE SB0, {st[D] - 2:#x}"]
        assert waits(two) == [f"DEPBAR.LE SB0, {st[D] - 1:#x}"]
        assert waits(single) == ["DEPBAR.LE SB0, 0x0"]


def test_fa2_route_is_the_kernel_with_another_epilogue_and_a_combine(cta_split_build):
    """The partial kernel's loop is the unsplit kernel's, instruction for instruction; only the
    epilogue differs (fp32 O by 8-byte stores, m and l, instead of fp16 O by 16-byte stores). The
    combine reads each split's O 16 bytes at a time and writes 8 bytes of O per thread."""
    arch, resources, sass, bn, st = cta_split_build
    assert sorted(PARTIALS.values()) == [64, 128]
    spec = registry.get("07_mma_split_ctas", arch)
    assert {spec.entries_by_split[2][D] for D in (64, 128)} == set(PARTIALS) and spec.helper_entries == (COMBINE,)
    loop = ("HMMA.16816.F32", "LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128", "SHFL.BFLY", "MUFU.EX2",
            "BAR.SYNC.DEFER_BLOCKING")
    for name, D in PARTIALS.items():
        ops, fused = _opcodes(sass[name]), _opcodes(sass[f"attn_fwd_07_mma_d{D}"])
        assert {op: ops[op] for op in loop} == {op: fused[op] for op in loop}, f"{name} on {arch}"
        assert ops["STG.E.64"] == 2 * (D // 8) and ops["STG.E.128"] == 0
        assert not any(op.split(".")[0] in ("LDG", "LDL", "STL") for op in ops), f"{name}: {ops}"
        f = resources[name]
        assert not f.spills and f.stack_bytes == 0 and f.static_smem == 0
        assert MIN_CTAS * THREADS * (-(-f.registers // 8) * 8) <= MAX_REGS_PER_SM, f"{name}: {f.registers} regs"
        assert spec.dynamic_smem(Shape(1, 1, 512, D)) == _smem(D, st[D], 1, bn)
    ops, f = _opcodes(sass[COMBINE]), resources[COMBINE]
    assert ops["LDG.E.128.CONSTANT"] >= 1 and ops["STG.E.64"] == 1 and not f.spills and f.static_smem == 0
    combine_threads = int(re.search(r"constexpr int COMBINE_THREADS = (\d+);", SRC).group(1))
    assert registry.COMBINE_THREADS == combine_threads

