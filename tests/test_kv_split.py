"""Chapter 7's key split: the launcher's choice (our rule, in the form of FlashAttention-2's
num_splits_heuristic but over the SMs of the GPU at hand where FA2 counts two CTA slots per SM),
FA2's own choice for comparison, and what each choice launches. The splits' correctness is the CPU
suite's and the model's (tests/test_executor_kernels.py, tests/test_model_07.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import attnlab.env
from attnlab import gpus
from attnlab.kernels import registry
from attnlab.kernels.registry import choose_kv_split, cta_split_candidates
from attnlab.shapes import MISSION, Shape
from attnlab.kernels.split_ctas import fa2_num_splits, fa2_num_splits_heuristic

SPEC = registry.get("07_mma")


def on_gpu(monkeypatch, name: str, sms: int):
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(name=name, multi_processor_count=sms))


def test_the_rule_counts_sms():
    ctas = lambda s: 64 * s  # noqa: E731 - the mission shape's grid: 64 CTAs unsplit
    assert choose_kv_split(ctas, (1, 2, 4), 58) == 1     # 64 >= 0.8 x 58: every L4 SM holds a CTA
    assert choose_kv_split(ctas, (1, 2, 4), 2 * 58) == 4  # FA2's count, two slots per SM: 64 < 0.8 x 116
    assert choose_kv_split(ctas, (1, 2, 4), 132) == 2    # 128 / 132 = 0.97 of a wave; 4 is no better
    assert choose_kv_split(ctas, (1, 2, 4), 300) == 4    # 256 / 300 = 0.85 against 128 / 300 = 0.43
    assert choose_kv_split(ctas, (1, 2), 300) == 2       # only the splits the build has
    assert choose_kv_split(lambda s: 3, (1, 2, 4), 132) == 1  # a split that adds no CTA is not taken
    with pytest.raises(ValueError):
        choose_kv_split(ctas, (2, 4), 132)


def test_the_rule_has_fa2s_form():
    """Given the same units and candidates, the rule is FA2's num_splits_heuristic, restated in
    split_ctas; its own comment's example: 48 CTAs on 108 units take 2 splits (0.89), not 3 (0.67)."""
    assert fa2_num_splits_heuristic(48, 108, 64) == 2
    for units in (58, 108, 116, 132, 264):
        for ctas in (1, 5, 16, 48, 64, 90, 200, 300):
            for n_blocks in (1, 2, 3, 7, 8, 16, 64, 300):
                assert choose_kv_split(lambda s, c=ctas: c * s, cta_split_candidates(n_blocks, units), units) == \
                    fa2_num_splits_heuristic(ctas, units, n_blocks), (units, ctas, n_blocks)


def test_fa2s_own_choice_at_the_target_shapes():
    """FA2 (64-row CTAs, 256-key blocks at D = 64, 2 x SMs): at the mission shape an L4's 64 CTAs are
    under 80% of its 116 slots, but its 2 key blocks allow only a split of 2, which fills the slots
    no better (128 / 116: 1.10 waves, the same 0.55 as one split), so it takes 1; an H100 takes 2,
    as the launcher does. The large shapes fill both GPUs."""
    l4, h100 = gpus.by_key("L4").sms, gpus.by_key("H100 SXM").sms
    assert fa2_num_splits(MISSION, l4) == 1 and fa2_num_splits(MISSION, h100) == 2
    assert fa2_num_splits(MISSION._replace(D=128), h100) == 4   # 128-key blocks: 4 of them
    for shape in (Shape(4, 16, 4096, 64), Shape(2, 16, 4096, 128)):
        assert fa2_num_splits(shape, l4) == fa2_num_splits(shape, h100) == 1
    # the launcher's rule at FA2's count would split the mission shape on the L4, where it does not
    assert registry.get("07_mma", "sm_89").kv_split(MISSION, 2 * l4) == 4
    assert registry.get("07_mma", "sm_89").kv_split(MISSION, l4) == 1


def test_without_a_gpu_the_launcher_sizes_for_the_l4(monkeypatch):
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: False)
    assert gpus.sm_count() == (58, "the L4's")
    assert SPEC.launch_config(MISSION) == {"grid": (8, 8, 1), "block": (128, 1, 1), "dynamic_smem": 40960,
                                           "entry": "attn_fwd_07_mma_d64", "kv_split": 1}


def test_on_an_h100_the_mission_shape_splits_the_keys_in_two(monkeypatch):
    on_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132)
    assert gpus.sm_count() == (132, "the NVIDIA H100 80GB HBM3's")
    for causal_shape in (MISSION, MISSION._replace(D=128)):
        cfg = SPEC.launch_config(causal_shape)
        assert cfg["kv_split"] == 2 and cfg["grid"] == (16, 8, 1) and cfg["block"] == (128, 1, 1)
        assert cfg["entry"] == f"attn_fwd_07_mma_split2_d{causal_shape.D}"
    # the large target shapes fill any GPU without a split
    for shape in (Shape(4, 16, 4096, 64), Shape(2, 16, 4096, 128)):
        assert SPEC.launch_config(shape)["kv_split"] == 1
    # the ablation never splits; the fixed-split variants always do
    assert registry.get("07_mma_nosplit").launch_config(MISSION)["grid"] == (8, 8, 1)
    assert registry.get("07_mma_split4").launch_config(Shape(4, 16, 4096, 64))["kv_split"] == 4


def test_a_split_the_head_dim_cannot_take_is_never_chosen(monkeypatch):
    on_gpu(monkeypatch, "a GPU with many SMs", 1000)
    assert SPEC.kv_split(Shape(1, 1, 512, 64)) == 4
    assert SPEC.kv_split(Shape(1, 1, 512, 128)) == 2   # 32-key tiles: a split of 4 leaves 8-key slices
    assert not registry.get("07_mma_split4").supports_head_dim(128)


# FlashAttention-2's route, the ablation 07_mma_split_ctas: the split across CTAs, then a combine.
CTAS = registry.get("07_mma_split_ctas")


def test_fa2s_route_splits_the_mission_shape_across_ctas_on_an_h100(monkeypatch):
    on_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132)
    cfg = CTAS.launch_config(MISSION)
    assert cfg == {"grid": (8, 8, 2), "block": (128, 1, 1), "dynamic_smem": 40960,
                   "entry": "attn_fwd_07_mma_partial_d64", "kv_split": 2}
    assert CTAS.launch_config(MISSION._replace(D=128))["entry"] == "attn_fwd_07_mma_partial_d128"
    # one head of 4096 keys: 64 query tiles; FA2 weighs up to 64 runs and takes 2 (128 CTAs)
    assert CTAS.kv_split(Shape(1, 1, 4096, 64)) == 2
    # on 1000 SMs: 13 runs (832 CTAs); 15 would give each CTA as many tiles as 14 does, 5, so FA2
    # never weighs it, and 16 spills into a second wave
    assert CTAS.kv_split(Shape(1, 1, 4096, 64), sms=1000) == 13
    for shape in (Shape(4, 16, 4096, 64), Shape(2, 16, 4096, 128)):
        assert CTAS.launch_config(shape)["kv_split"] == 1


def test_fa2s_route_at_split_1_is_the_unsplit_kernel(monkeypatch):
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: False)  # the L4's 58 SMs: 64 CTAs fill them
    cfg = CTAS.launch_config(MISSION)
    assert cfg == registry.get("07_mma_nosplit").launch_config(MISSION)
    assert CTAS.entries_at_head_dim(64) == ["attn_fwd_07_mma_d64", "attn_fwd_07_mma_partial_d64"]
    assert CTAS.helper_entries == ("attn_combine_07",)


@pytest.mark.parametrize("sms,launches", [(132, 2), (58, 1)])
def test_the_runner_launches_the_partials_then_the_combine(monkeypatch, sms, launches):
    """The GPU runner's sequence, with the launches recorded instead of made."""
    import attnlab.kernels.compile
    from attnlab.gpu import launch
    from attnlab.kernels import split_ctas

    on_gpu(monkeypatch, "a GPU", sms)
    made = []
    monkeypatch.setattr(attnlab.kernels.compile, "load_function", lambda spec, entry, device: entry)
    record = lambda fn, cfg, args, device: made.append((fn, cfg, args))  # noqa: E731
    monkeypatch.setattr(launch, "run_on_torch_stream", record)
    q, k, v, out = (torch.zeros(MISSION, dtype=torch.float16) for _ in range(4))
    launch.run_split_ctas(CTAS, MISSION, q, k, v, out, True, 0.125)
    assert len(made) == launches
    fn, cfg, args = made[0]
    assert fn == cfg["entry"] == CTAS.launch_config(MISSION)["entry"] and cfg["grid"][2] == launches
    if launches == 1:
        assert args[3] == out.data_ptr()  # straight into out
        return
    assert args[3] != out.data_ptr() and [int(a) for a in args[5:]] == [512, 64, 0, 1]
    fn, cfg, args = made[1]
    assert fn == "attn_combine_07" and cfg == split_ctas.combine_config(MISSION)
    assert cfg["grid"][0] * cfg["block"][0] == 8 * 512 * 64 // 4  # a thread per 4 columns of a row
    assert args[2] == out.data_ptr() and [int(a) for a in args[3:6]] == [8 * 512, 64, 2]
    assert split_ctas.scratch_bytes(MISSION, 2) == 4 * 2 * 8 * 512 * 66


@pytest.mark.parametrize("kernel_id", ["07_mma", "07_mma_split_ctas", "07_mma_nosplit", "07_mma_rows_that_fill"])
def test_a_launch_asks_for_the_sm_count_once(monkeypatch, kernel_id):
    """launch_config is on every launch's path: the split is taken once, and grid, shared memory and
    entry follow from it (they agree with the spec's own functions)."""
    asked = []
    monkeypatch.setattr(gpus, "sm_count", lambda: asked.append(1) or (132, "an H100's"))
    spec = registry.get(kernel_id)
    cfg = spec.launch_config(MISSION)
    assert len(asked) == (0 if kernel_id == "07_mma_nosplit" else 1)
    assert cfg["grid"] == spec.grid(MISSION) and cfg["dynamic_smem"] == spec.dynamic_smem(MISSION)
    assert cfg["entry"] == spec.entry_at(MISSION) and cfg["kv_split"] == (1 if kernel_id == "07_mma_nosplit" else 2)


ROWS_THAT_FILL = [Shape(1, 8, 512, 64), Shape(1, 8, 512, 128), Shape(4, 16, 4096, 64), Shape(2, 16, 4096, 128),
                  Shape(2, 3, 130, 64), Shape(1, 1, 17, 128)]


@pytest.mark.parametrize("arch,sms", [("sm_89", 58), ("sm_90", 132), ("sm_80", 108)])
def test_step_7_9_launches_step_7_8_where_its_unsplit_grid_fills_the_gpu_and_step_7_6_elsewhere(arch, sms):
    """07_mma_rows_that_fill adds no entry: at every shape it launches exactly what one of its
    alternatives launches, step 7.8's where 7.8's unsplit grid (128-row tiles at D = 64, 64 at
    D = 128) covers SPLIT_FILL of the SMs, else step 7.6's with 7.6's key split."""
    from attnlab.kernels.chapters.ch07_mma import SPLIT_FILL

    spec = registry.get("07_mma_rows_that_fill", arch)
    six, eight = registry.get("07_mma", arch), registry.get("07_mma_across_heads", arch)
    edge = int(SPLIT_FILL * sms)  # the most heads of one 128-row (D = 64) or 64-row (D = 128) tile that do not fill
    edges = [Shape(1, edge, 128, 64), Shape(1, edge + 1, 128, 64), Shape(1, edge, 64, 128), Shape(1, edge + 1, 64, 128),
             Shape(1, edge // 2, 129, 64), Shape(1, edge // 2 + 1, 129, 64)]  # 129 rows: two tiles a head
    for s in ROWS_THAT_FILL + edges:
        rows = 128 if s.D == 64 else 64
        fills = -(-s.L // rows) * s.B * s.H >= SPLIT_FILL * sms
        chosen = eight if fills else six
        assert spec.runs(s, sms) is chosen, (arch, s)
        assert spec.launch_config(s, sms) == chosen.launch_config(s, sms), (arch, s)
        if fills:
            assert spec.launch_config(s, sms)["kv_split"] == 1  # a grid that fills is never split
    assert [spec.runs(s, sms).id for s in edges] == ["07_mma", "07_mma_across_heads"] * 3
    # The mission shape at D = 64: 32 CTAs of 128 rows fill neither GPU, so step 7.6's launch runs
    # (unsplit on the L4, split two ways on an H100), not 7.8's four-way split.
    assert spec.launch_config(MISSION, 58)["entry"] == "attn_fwd_07_mma_d64"
    assert spec.launch_config(MISSION, 132)["entry"] == "attn_fwd_07_mma_split2_d64"
    assert spec.launch_config(Shape(4, 16, 4096, 64), sms)["entry"] == "attn_fwd_07_mma_across_heads_d64"


def test_step_7_9_builds_inspects_and_orders_what_its_alternatives_launch():
    """Its entries are both alternatives' (the CPU build, the static inspection and the profiler
    take them all), a chosen configuration reaches the alternative it launches, and the executor's
    one-head counts follow the order of the launch it takes (interleaved heads only under 7.8's)."""
    from attnlab.executor.trace import one_head_grid
    from attnlab.kernels.static import launched_smem

    spec = registry.get("07_mma_rows_that_fill", "sm_90")
    for D in (64, 128):
        assert spec.entries_at_head_dim(D) == list(dict.fromkeys(
            registry.get("07_mma", "sm_90").entries_at_head_dim(D)
            + registry.get("07_mma_across_heads", "sm_90").entries_at_head_dim(D)))
    six, eight = launched_smem(registry.get("07_mma", "sm_90")), launched_smem(registry.get("07_mma_across_heads", "sm_90"))
    assert launched_smem(spec) == {e: max(six.get(e, 0), eight.get(e, 0)) for e in {**six, **eight}}
    eight_warps = spec.with_config({"ATTN07_WARPS": 8})
    for s, kid in ((Shape(4, 16, 4096, 64), "07_mma_across_heads"), (MISSION, "07_mma")):
        ran = eight_warps.runs(s, 132)
        assert ran.id == kid and ran.config == {**registry.get(kid, "sm_90").config, "ATTN07_WARPS": 8}
    # the shared memory of either launch must fit: 8 warps of two row blocks at D = 64 double the Q tile
    assert eight_warps.config_problems(64, "sm_90") == list(dict.fromkeys(
        registry.get("07_mma", "sm_90").with_config({"ATTN07_WARPS": 8}).config_problems(64, "sm_90")
        + registry.get("07_mma_across_heads", "sm_90").with_config({"ATTN07_WARPS": 8}).config_problems(64, "sm_90")))
    large = Shape(4, 16, 4096, 64)
    assert one_head_grid(spec, large, 132, causal=True) == (32, 64)  # 7.8's: CTA i takes head i % (B H)
    assert one_head_grid(spec, Shape(1, 40, 256, 64), 132, causal=True) == (4, 1)  # 7.6's: a head's CTAs in a row


@pytest.mark.parametrize("causal", [False, True])
def test_step_7_9_passes_the_cpu_check_where_it_takes_step_7_8s_launch(causal):
    """The CPU suite's shapes are too small for step 7.8's grid to fill a GPU, so there step 7.9
    runs step 7.6's launch: here 120 heads of one 128-row tile each fill it, and step 7.9 runs step
    7.8's entry, checked against the reference on the executor."""
    from attnlab.executor import cpu

    # 120 heads of one tile fill 0.8 x the SMs of any GPU up to 150 SMs, the one at hand included:
    # the check launches as the GPU at hand would
    spec, shape = registry.get("07_mma_rows_that_fill", "sm_89"), Shape(1, 120, 100, 64)
    assert spec.runs(shape).id == "07_mma_across_heads"
    assert spec.launch_config(shape)["entry"] == "attn_fwd_07_mma_across_heads_d64"
    case = cpu.check_case_cpu(spec, shape, causal, 0)
    assert case.passed and not case.findings, case


def test_the_even_rule_weighs_the_unsplit_grid_as_any_split():
    """choose_even_split is step 7.6's rule without its shortcut: 64 CTAs on the L4's 58 SMs leave 6
    SMs with two (efficiency 0.55), and the four-way split's 256 leave the busiest with 5 of an
    average 4.4 (0.88), the only one within SPLIT_EFFICIENCY of the best."""
    from attnlab.kernels.chapters.ch07_mma import choose_even_split

    ctas = lambda s: 64 * s  # noqa: E731
    assert choose_kv_split(ctas, (1, 2, 4), 58) == 1 and choose_even_split(ctas, (1, 2, 4), 58) == 4
    assert choose_even_split(ctas, (1, 2, 4), 132) == 2  # as step 7.6: 128 / 132 and 256 / 264 tie
    assert choose_even_split(ctas, (1, 2, 4), 64) == 1   # a whole wave unsplit
    assert choose_even_split(lambda s: 3, (1, 2, 4), 132) == 1  # a split that adds no CTA is not taken


def _options(arch: str, s: Shape):
    """(kernel, split) of every launch step 7.10 weighs at `s`, in its order of preference."""
    from attnlab.kernels.chapters.ch07_mma import splits_at

    six = registry.get("07_mma", arch)
    return [(registry.get("07_mma_across_heads", arch), 1)] + [(six, k) for k in splits_at(six.config, s.D)]


def _efficiency(spec, s: Shape, k: int, sms: int) -> float:
    gx, gy, gz = spec.launch_config(s, sms, split=k)["grid"]
    n = gx * gy * gz
    return n / sms / -(-n // sms)


@pytest.mark.parametrize("arch,sms", [("sm_89", 58), ("sm_90", 132), ("sm_80", 108)])
def test_step_7_10_launches_the_first_launch_within_reach_of_the_most_even(arch, sms):
    """07_mma_even_split adds no entry: at every shape it launches what step 7.8 (unsplit) or step
    7.6 (at a split its build has) launches there, the first of them, in that order, whose wave
    efficiency is within SPLIT_EFFICIENCY of the most even; never less even than step 7.9's launch."""
    from attnlab.kernels.chapters.ch07_mma import SPLIT_EFFICIENCY

    spec, nine = registry.get("07_mma_even_split", arch), registry.get("07_mma_rows_that_fill", arch)
    for s in ROWS_THAT_FILL + [Shape(1, 58, 100, 64), Shape(1, 59, 100, 64), Shape(3, 5, 700, 128)]:
        options = _options(arch, s)
        best = max(_efficiency(alt, s, k, sms) for alt, k in options)
        alt, k = next((alt, k) for alt, k in options if _efficiency(alt, s, k, sms) >= SPLIT_EFFICIENCY * best)
        assert spec.runs(s, sms).id == alt.id, (arch, s)
        assert spec.launch_config(s, sms) == alt.launch_config(s, sms, split=k), (arch, s)
        mine = spec.launch_config(s, sms)
        theirs = nine.launch_config(s, sms)
        assert _efficiency(spec.runs(s, sms), s, mine["kv_split"], sms) >= \
            _efficiency(nine.runs(s, sms), s, theirs["kv_split"], sms) - 1e-12, (arch, s)
    # The mission shape: on the L4 step 7.6's four-way split where step 7.9 ran it unsplit, and at
    # D = 128 its two-way split where step 7.9 ran step 7.8's 64 CTAs; on an H100 as step 7.9.
    if sms == 58:
        assert nine.launch_config(MISSION, sms)["entry"] == "attn_fwd_07_mma_d64"
        assert spec.launch_config(MISSION, sms)["entry"] == "attn_fwd_07_mma_split4_d64"
        assert spec.launch_config(Shape(1, 8, 512, 128), sms)["entry"] == "attn_fwd_07_mma_split2_d128"
    if sms == 132:
        assert spec.launch_config(MISSION, sms) == nine.launch_config(MISSION, sms)
    assert spec.launch_config(Shape(4, 16, 4096, 64), sms)["entry"] == "attn_fwd_07_mma_across_heads_d64"


@pytest.mark.parametrize("causal", [False, True])
def test_step_7_10_passes_the_cpu_check_where_it_takes_step_7_8s_launch(causal):
    """At the CPU suite's shapes step 7.10 launches step 7.6's entries; here two heads of one 128-row
    tile per SM of the GPU the executor launches for (the L4's 58 without one) make two whole waves
    of step 7.8's unsplit grid, the most even launch, and step 7.10 runs step 7.8's entry, checked
    against the reference on the executor."""
    from attnlab.executor import cpu

    spec, shape = registry.get("07_mma_even_split", "sm_89"), Shape(1, 2 * gpus.sm_count()[0], 100, 64)
    assert spec.launch_config(shape)["entry"] == "attn_fwd_07_mma_across_heads_d64"
    case = cpu.check_case_cpu(spec, shape, causal, 0)
    assert case.passed and not case.findings, case


KERNEL_ONLY_STEPS = [("07_mma_lean_loop", "attn_fwd_07_mma_lean"), ("07_mma_whole_tile_copy", "attn_fwd_07_mma_whole_tiles"),
                     ("07_mma_pv_a_tile_later", "attn_fwd_07_mma_deferred_pv")]
# The prefix of each step's two-row entries at D = 64: step 7.13 keeps step 7.12's there.
TWO_ROWS_AT_64 = {"attn_fwd_07_mma_deferred_pv": "attn_fwd_07_mma_whole_tiles"}


@pytest.mark.parametrize("kid,prefix", KERNEL_ONLY_STEPS)
@pytest.mark.parametrize("arch,sms", [("sm_89", 58), ("sm_90", 132), ("sm_80", 108)])
def test_steps_7_11_to_7_13_launch_step_7_10s_launch_with_their_own_kernel(kid, prefix, arch, sms):
    """07_mma_lean_loop, 07_mma_whole_tile_copy and 07_mma_pv_a_tile_later change the kernel, not the launcher: at every shape
    their grid, block, shared memory and key split are step 7.10's, and their entry is their own twin
    of step 7.10's."""
    mine_spec, ten = registry.get(kid, arch), registry.get("07_mma_even_split", arch)
    for s in ROWS_THAT_FILL + [MISSION, Shape(1, 8, 512, 128), Shape(1, 58, 100, 64), Shape(3, 5, 700, 128)]:
        mine, theirs = mine_spec.launch_config(s, sms), ten.launch_config(s, sms)
        own = TWO_ROWS_AT_64.get(prefix, prefix) if "_across_heads" in theirs["entry"] and s.D == 64 else prefix
        assert mine["entry"] == theirs["entry"].replace("attn_fwd_07_mma", own, 1), (arch, s)
        assert {k: v for k, v in mine.items() if k != "entry"} == {k: v for k, v in theirs.items() if k != "entry"}


@pytest.mark.parametrize("kid,prefix", KERNEL_ONLY_STEPS)
@pytest.mark.parametrize("causal", [False, True])
def test_steps_7_11_to_7_13_pass_the_cpu_check_where_they_take_step_7_8s_launch(kid, prefix, causal):
    """As for step 7.10: two 128-row tiles of one head per SM, so that each runs its two-row-block
    entry. L = 228 makes four 64-key tiles: the prologue copies the first, the loop the two whole ones
    (load_whole_tile) and the ragged last one (load_tile, with its row tests)."""
    from attnlab.executor import cpu

    spec, shape = registry.get(kid, "sm_89"), Shape(1, gpus.sm_count()[0], 228, 64)
    assert spec.launch_config(shape)["entry"] == f"{TWO_ROWS_AT_64.get(prefix, prefix)}_across_heads_d64"
    case = cpu.check_case_cpu(spec, shape, causal, 0)
    assert case.passed and not case.findings, case


@pytest.mark.parametrize("arch,sms", [("sm_89", 58), ("sm_90", 132), ("sm_80", 108)])
def test_two_rows_at_d128_launches_step_7_13s_launches_but_two_row_blocks_at_d128(arch, sms):
    """The ablation 07_mma_two_rows_at_d128 changes step 7.13's two-row launch at D = 128 only: wherever
    the launcher takes it, the entry is its own (128-row CTAs, 32-key tiles: Q 32 KB and a 16 KB K/V
    stage), and everywhere else it launches what step 7.13 launches (at D = 128 the one-row launch
    where step 7.13 took its two-row one, which there is one row block with its causal tiles across
    the heads)."""
    ablation, thirteen = registry.get("07_mma_two_rows_at_d128", arch), registry.get("07_mma_pv_a_tile_later", arch)
    stages = ablation.config["ATTN07_STAGES_D128"]
    took = set()
    for s in ROWS_THAT_FILL + [MISSION, Shape(1, 8, 512, 128), Shape(1, sms, 228, 128), Shape(3, 5, 700, 128)]:
        mine, theirs = ablation.launch_config(s, sms), thirteen.launch_config(s, sms)
        if mine["entry"].startswith("attn_fwd_07_mma_q_from_tile"):
            took.add(s)
            assert s.D == 128 and mine["kv_split"] == 1 and mine["entry"] == "attn_fwd_07_mma_q_from_tile_d128"
            assert mine["grid"] == (-(-s.L // 128), s.B * s.H, 1)
            assert mine["dynamic_smem"] == 2 * 128 * 128 + stages * 2 * 32 * 2 * 128
            assert theirs["entry"] == "attn_fwd_07_mma_deferred_pv_across_heads_d128"  # step 7.13's two-row launch
        elif s.D == 128 and theirs["entry"].startswith("attn_fwd_07_mma_deferred_pv_across_heads"):
            assert mine == {**theirs, "entry": theirs["entry"].replace("_across_heads", "")}, (arch, s)
        else:
            assert mine == theirs, (arch, s)
    assert Shape(2, 16, 4096, 128) in took and Shape(1, sms, 228, 128) in took


@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, -0.09])
def test_two_row_blocks_at_d128_pass_the_cpu_check_over_many_key_tiles(arch, causal, scale):
    """The two-row entry at D = 128 (Q read from its tile at every k-step) against the fp64 reference
    on the executor, with the launcher's choice on a one-SM GPU: its unsplit 128-row launch (the
    executor suite reaches it only up to L = 64). L = 228 makes eight 32-key tiles, the last ragged,
    and a second, partial query tile; a negative scale flips the sign of every Q fragment the loop
    reads. No finding, and the check's pass rule."""
    from attnlab.executor import cpu
    from attnlab.pass_rule import ATOL_FLOOR, INPUT_OFFSET, judge, make_inputs
    from attnlab.reference import naive_fp16, reference_attention

    spec, shape = registry.get("07_mma_two_rows_at_d128", arch), Shape(1, 2, 228, 128)
    assert spec.launch_config(shape, 1)["entry"] == "attn_fwd_07_mma_q_from_tile_d128"
    q, k, v = make_inputs(shape, 0, device="cpu", offset=INPUT_OFFSET)
    ref = reference_attention(q, k, v, causal, scale)
    fp16_err = float((naive_fp16(q, k, v, causal, scale).double() - ref).abs().max())
    out, report = cpu.attention_cpu(spec, q, k, v, causal, scale, sms=1)
    assert report.completed and not report.findings, report.findings
    verdict = judge(out, ref, fp16_err, ATOL_FLOOR)
    assert verdict.passed, verdict.reason
