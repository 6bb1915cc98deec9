"""Chapter 8's search without a GPU: the knobs mirror the kernels, configured geometry is right,
the space is exactly what the rules allow, the strategies behave (with a synthetic fitness), the
static gate runs nvcc for real on a few configurations, and records feed the tuned launcher."""
from __future__ import annotations

import itertools
import re
import subprocess

import pytest

from attnlab.kernels import registry, toolchain
from attnlab.gpu import search, tuned
from attnlab.kernels.compile import define_flags
from attnlab.paths import kernels_dir
from attnlab.kernels.registry import L4_MAX_SMEM_PER_BLOCK
from attnlab.records.results import validate_record, write_record
from attnlab.gpu.search import Trial, evolve, exhaustive
from attnlab.shapes import MISSION, Shape

TUNABLE = ("05_wmma", "06_warp_specialized", "07_mma")


def _src(name: str) -> str:
    return (kernels_dir() / name).read_text()


# --- the knobs mirror the sources ---------------------------------------------------------------

def test_searchable_kernels_are_the_chapters_own():
    assert search.searchable() == list(TUNABLE)
    for kid, spec in registry.KERNELS.items():
        # chapter 7's ablations and variants carry 07_mma's knobs (to take its tiles on each GPU)
        assert (spec.tuning is not None) == (kid in TUNABLE or spec.variant_of == "07_mma"), kid


@pytest.mark.parametrize("kernel_id", TUNABLE)
def test_every_knob_is_read_by_the_kernel_source(kernel_id):
    spec = registry.get(kernel_id)
    text = "\n".join(_src(name) for name in [spec.source, *spec.extra_sources] if (kernels_dir() / name).exists())
    for knob in spec.tuning.knobs:  # read under its own #ifdef, or beside its pair's (BLOCK_N_D64/D128)
        assert re.search(rf"\b{knob.name}\b", text), f"{knob.name} is not read by {spec.source}"
        assert knob.default in knob.values, knob
    guarded = re.findall(r"#ifn?def (ATTN\w+)", text)
    assert {k.name for k in spec.tuning.knobs if not k.name.endswith("_D128")} <= set(guarded)


def test_knob_defaults_are_the_chapters_constants():
    tile, k05, k06, k07 = _src("wmma_tile.cuh"), _src("05_wmma.cu"), _src("06_warp_specialized.cu"), _src("07_mma_swizzle.cu")
    lit = lambda src, name: int(re.search(rf"constexpr int {name} = (\d+);", src).group(1))  # noqa: E731
    d05, d06, d07 = (registry.get(k).tuning.defaults for k in TUNABLE)
    assert d05 == {"ATTN_WMMA_BLOCK_M": lit(tile, "BLOCK_M"), "ATTN05_BLOCK_N": lit(k05, "BLOCK_N")}
    assert (d06["ATTN06_BLOCK_N_D64"], d06["ATTN06_BLOCK_N_D128"]) == (lit(k06, "BLOCK_N_D64"), lit(k06, "BLOCK_N_D128"))
    assert d06["ATTN06_STAGES"] == int(re.search(r"#define ATTN06_STAGES (\d+)", k06).group(1))
    assert d06["ATTN06_PRODUCERS"] == int(re.search(r"#define ATTN06_PRODUCERS (\d+)", k06).group(1))
    assert d07 == {"ATTN07_WARPS": lit(k07, "WARPS"), "ATTN07_BLOCK_N_D64": lit(k07, "BLOCK_N_D64"),
                   "ATTN07_BLOCK_N_D128": lit(k07, "BLOCK_N_D128"), "ATTN07_STAGES_D64": lit(k07, "STAGES_D64"),
                   "ATTN07_STAGES_D128": lit(k07, "STAGES_D128"), "ATTN07_MIN_CTAS": lit(k07, "MIN_CTAS_PER_SM")}


# --- configured specs ----------------------------------------------------------------------------

def test_with_config_computes_the_geometry_from_the_knobs():
    spec = registry.get("07_mma")
    assert spec.with_config({}) is spec and spec.with_config(spec.tuning.defaults) is spec
    cfg = spec.with_config({"ATTN07_WARPS": 8, "ATTN07_BLOCK_N_D64": 32})
    assert dict(cfg.defines) == {**spec.tuning.defaults, "ATTN07_WARPS": 8, "ATTN07_BLOCK_N_D64": 32}
    assert cfg.config_label() == "ATTN07_BLOCK_N_D64=32, ATTN07_WARPS=8"
    for L in (1, 127, 128, 129, 4096):
        split = cfg.kv_split(Shape(2, 3, L, 64))
        assert split in (1, 2)  # 8 warps and 32-key tiles: a split of 4 would leave 8-key slices
        assert cfg.launch_config(Shape(2, 3, L, 64)) == {
            "grid": (-(-L // (128 // split)), 6, 1), "block": (256, 1, 1),
            # Q, then the two K/V stages, or the merge's partials where they are larger (8 warps:
            # 4 per group x 32 lanes x (64/2 + 4) fp32 words = 18 KB against 16 KB of stages)
            "dynamic_smem": 2 * 64 * (128 // split) + max(2 * 2 * 32 * 2 * 64, (split - 1) * 4 * 32 * 36 * 4),
            "entry": "attn_fwd_07_mma_d64" if split == 1 else "attn_fwd_07_mma_split2_d64", "kv_split": split}
        if cfg.kv_split(Shape(2, 3, L, 128)) == 1:
            assert cfg.launch_config(Shape(2, 3, L, 128))["dynamic_smem"] == 2 * 128 * (128 + 2 * 2 * 32)
    assert cfg.kv_split(Shape(2, 3, 4096, 64)) == 1 and cfg.kv_split(Shape(2, 3, 127, 64)) == 2
    assert cfg.entry_for(128) == spec.entry_for(128) and cfg.id == spec.id and cfg.source == spec.source
    assert spec.defines == () and spec.launch_config(MISSION)["block"] == (128, 1, 1)  # the registry is untouched


@pytest.mark.parametrize("variant", [k for k in registry.ch06_warp_specialized.VARIANTS if k != "06_warp_specialized"])
def test_configured_chapter6_kernel_matches_its_sweep_variants(variant):
    """06's stages and producers as knobs give the geometry of the sweep files that fix them."""
    stages, producers = registry.ch06_warp_specialized.VARIANTS[variant]
    cfg = registry.get("06_warp_specialized").with_config({"ATTN06_STAGES": stages, "ATTN06_PRODUCERS": producers})
    for shape in (MISSION, Shape(1, 2, 333, 128), Shape(2, 8, 2048, 64)):
        same = ("grid", "block", "dynamic_smem", "kv_split")  # the entries differ in name only
        assert {k: cfg.launch_config(shape)[k] for k in same} == \
            {k: registry.get(variant).launch_config(shape)[k] for k in same}


def test_with_config_refuses_what_it_does_not_know():
    spec = registry.get("07_mma")
    with pytest.raises(ValueError, match="no knob"):
        spec.with_config({"ATTN07_NOPE": 1})
    with pytest.raises(ValueError, match="not one of"):
        spec.with_config({"ATTN07_WARPS": 3})
    with pytest.raises(ValueError, match="has no knobs"):
        registry.get("04_cublas_hybrid").with_config({"ATTN07_WARPS": 8})
    with pytest.raises(ValueError, match="no knobs to search"):
        search.space("07_mma_noswizzle", 64)  # an ablation takes 07_mma's knobs to follow its tiles, no search
    with pytest.raises(ValueError, match="no knobs to search"):
        search.space("01_scalar", 64)


def test_define_flags_and_cache_keys():
    from attnlab.kernels.compile import config_tag, cubin_path

    spec = registry.get("07_mma")
    cfg = spec.with_config({"ATTN07_WARPS": 2})
    assert define_flags(spec.defines) == [] and config_tag(spec.defines) == ""
    assert "-DATTN07_WARPS=2" in define_flags(cfg.defines) and len(define_flags(cfg.defines)) == 6
    assert cubin_path(cfg, "sm_89") != cubin_path(spec, "sm_89") != cubin_path(spec, "sm_90")
    assert config_tag(cfg.defines) == config_tag(tuple(reversed(cfg.defines)))


# --- the space -----------------------------------------------------------------------------------

def _smem_first_principles(kernel_id: str, c: dict, D: int) -> int:
    """Shared memory written out again from the kernels' comments, independently of the registry."""
    if kernel_id == "07_mma":
        bm, bn, stages = 16 * c["ATTN07_WARPS"], c[f"ATTN07_BLOCK_N_D{D}"], c[f"ATTN07_STAGES_D{D}"]
        return 2 * D * bm + stages * (2 * D * bn) * 2                # Q, then the stages of K and V
    bm = c["ATTN_WMMA_BLOCK_M"]
    if kernel_id == "05_wmma":
        bn, tiles = c["ATTN05_BLOCK_N"], 2
    else:
        bn, tiles = c[f"ATTN06_BLOCK_N_D{D}"], 2 * c["ATTN06_STAGES"]
    return tiles * bn * (D + 8) * 2 + bm * (bn + 4) * 4 + bm * (bn + 8) * 2 + bm * (D + 4) * 4


@pytest.mark.parametrize("kernel_id", TUNABLE)
@pytest.mark.parametrize("D", (64, 128))
def test_valid_space_is_exactly_what_the_rules_allow(kernel_id, D):
    knobs = search.knobs_for(kernel_id, D)
    assert all(k.head_dim in (None, D) for k in knobs)
    full = [dict(zip([k.name for k in knobs], v)) for v in itertools.product(*(k.values for k in knobs))]
    assert search.space(kernel_id, D) == full

    def allowed(c):
        smem = _smem_first_principles(kernel_id, c, D)
        if smem > L4_MAX_SMEM_PER_BLOCK:
            return False
        if kernel_id == "07_mma" and (c[f"ATTN07_BLOCK_N_D{D}"] * D // 8) % (32 * c["ATTN07_WARPS"]):
            return False                                           # load_tile's static_assert
        # MIN_CTAS_PER_SM CTAs, each with the runtime's 1 KB, rounded to 128 B, in an L4 SM's 100 KB
        if kernel_id == "07_mma" and c["ATTN07_MIN_CTAS"] * (-(-(smem + 1024) // 128) * 128) > 100 * 1024:
            return False
        return True

    valid = search.valid_space(kernel_id, D)
    assert valid == [c for c in full if allowed(c)]
    assert search.default_config(kernel_id, D) in valid
    for c in full:
        spec = registry.get(kernel_id).with_config(c)
        assert spec.dynamic_smem(Shape(1, 1, 7, D)) == _smem_first_principles(kernel_id, c, D)


def test_a_configuration_that_breaks_its_promise_of_resident_ctas_is_refused():
    """MIN_CTAS_PER_SM = 2 with tiles that let one CTA share an SM: ptxas would cap each thread's
    registers for a second CTA that never comes. Refused before compiling; MIN_CTAS = 1 is not."""
    wide = {"ATTN07_BLOCK_N_D64": 128}  # Q 8 KB + 2 x (16 KB + 16 KB) = 72 KB: one per L4 SM
    problems = search.arithmetic_problems("07_mma", wide, 64)
    assert len(problems) == 1 and "lets 1 CTA(s) share an sm_89 SM, fewer than the 2" in problems[0]
    assert search.arithmetic_problems("07_mma", {**wide, "ATTN07_MIN_CTAS": 1}, 64) == []
    three = {"ATTN07_STAGES_D64": 3}  # 56 KB: two fit an H100 SM, not an L4's
    assert search.arithmetic_problems("07_mma", three, 64) and not \
        registry.get("07_mma", "sm_90").with_config(three).config_problems(64)
    for arch in ("sm_80", "sm_86", "sm_89", "sm_90"):  # the chapter's tiles keep the promise everywhere
        assert all(not registry.get("07_mma", arch).config_problems(D) for D in (64, 128)), arch


def test_occupancy_follows_the_calculator():
    # 07 at D=64 as the chapter sizes it: 40 KB + 1 KB per block, two blocks in the L4's 100 KB.
    occ = search.occupancy("sm_89", 128, 151, 40960)
    assert (occ.blocks_per_sm, occ.limiter) == (2, "shared memory")
    assert search.occupancy("sm_89", 128, 255, 0).limiter == "registers"      # 8 KB registers per warp
    assert search.occupancy("sm_89", 1024, 32, 0).blocks_per_sm == 1          # 1536 threads per SM
    assert search.occupancy("sm_80", 1024, 32, 0).blocks_per_sm == 2
    assert search.occupancy("sm_89", 32, 16, 0).limiter == "blocks"
    assert 0 < occ.fraction <= 1


# --- strategies with a synthetic fitness ----------------------------------------------------------

GRID = [{"a": a, "b": b, "c": c, "d": d} for a, b, c, d in itertools.product((1, 2, 3, 4), (1, 2, 3, 4), (0, 1), (5, 6, 7))]
OPTIMUM = {"a": 3, "b": 2, "c": 1, "d": 6}


def synthetic_fitness(calls=None, clock=None, fail=(OPTIMUM,), refuse=lambda c: c["a"] == 4 and c["d"] == 7):
    """A smooth bowl with its minimum at OPTIMUM, which fails the correctness gate; one corner is
    refused by the "static gate". Deterministic; optionally counts calls and advances a clock."""
    def fitness(config):
        if calls is not None:
            calls.append(dict(config))
        if clock is not None:
            clock[0] += 1.0
        if refuse(config):
            return Trial(config, "static", reason="synthetic: spills")
        if config in fail:
            return Trial(config, "failed", reason="synthetic: wrong output")
        t = 10 + sum((config[k] - OPTIMUM[k]) ** 2 for k in "abcd")
        return Trial(config, "ok", float(t))
    return fitness


def test_exhaustive_tries_exactly_the_valid_space_once():
    candidates = search.valid_space("06_warp_specialized", 64)
    calls = []
    result = exhaustive(candidates, lambda c: (calls.append(c), Trial(c, "ok", 1.0 + len(calls)))[1])
    assert calls == candidates and result.stopped == "space exhausted"
    assert result.best.config == candidates[0] and result.counts()["ok"] == len(candidates)


def test_exhaustive_stops_at_the_budget():
    clock, calls = [0.0], []
    result = exhaustive(GRID, synthetic_fitness(calls, clock), budget_s=5, clock=lambda: clock[0])
    assert len(calls) == 5 and result.stopped == "budget" and len(result.trials) == 5


def test_evolve_keeps_its_elite_and_improves():
    result = evolve(GRID, synthetic_fitness(), seed=3, population=6, elite=2, generations=8, start=[GRID[0]])
    pops = result.populations
    assert len(pops) >= 3
    times = {search._key(t.config): t.time_us for t in result.trials}
    for before, after in zip(pops, pops[1:]):
        assert all(c in after for c in before[:2]), "the elite is carried into the next generation"
        assert min(times[search._key(c)] for c in after) <= min(times[search._key(c)] for c in before)
    best = result.best
    assert best.config in pops[-1] and best.time_us == min(t.time_us for t in result.trials if t.admitted)
    assert best.time_us < result.trials[0].time_us


def test_evolve_never_admits_a_configuration_that_failed_a_gate():
    result = evolve(GRID, synthetic_fitness(), seed=0, population=8, elite=2, generations=12)
    failed = [t.config for t in result.trials if not t.admitted]
    assert any(t.status == "failed" for t in result.trials) or OPTIMUM not in [t.config for t in result.trials]
    for pop in result.populations:
        assert not [c for c in pop if c in failed]
    assert result.best.status == "ok" and result.best.config != OPTIMUM


def test_evolve_tries_each_configuration_once_and_respects_the_budget():
    clock, calls = [0.0], []
    result = evolve(GRID, synthetic_fitness(calls, clock), seed=1, population=6, generations=50, budget_s=20,
                    clock=lambda: clock[0])
    assert result.stopped == "budget" and len(calls) == 20 == len(result.trials)
    assert len({search._key(c) for c in calls}) == len(calls)
    unlimited = evolve(GRID, synthetic_fitness(), seed=1, population=6, generations=500)
    assert unlimited.stopped == "space exhausted" and len(unlimited.trials) == len(GRID)


def test_evolve_is_deterministic_for_a_seed():
    run = lambda seed: [t.config for t in evolve(GRID, synthetic_fitness(), seed=seed, population=6,  # noqa: E731
                                                 generations=5).trials]
    assert run(7) == run(7)
    assert len({tuple(map(search._key, run(s))) for s in (0, 1, 2, 3)}) > 1


def test_evolve_copes_with_a_start_that_fails():
    everything_fails_but_one = lambda c: Trial(c, "ok", 5.0) if c == GRID[-1] else Trial(c, "failed", reason="x")  # noqa: E731
    result = evolve(GRID, everything_fails_but_one, seed=0, population=4, generations=3, start=[GRID[0]])
    assert result.best.config == GRID[-1]
    assert all(pop == [GRID[-1]] for pop in result.populations)


def test_trial_refuses_an_ok_without_a_time():
    with pytest.raises(ValueError):
        Trial({}, "ok", None)
    with pytest.raises(ValueError):
        Trial({}, "great", 1.0)
    assert Trial({}, "failed", 3.0).time_us is None


# --- the static gate, for real -------------------------------------------------------------------

@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_static_gate_builds_with_nvcc(fresh_cache):
    ok = search.static_gate("07_mma", search.default_config("07_mma", 64), 64, "sm_89")
    assert ok.ok and ok.compiled and ok.registers and ok.spill_bytes == 0
    assert ok.dynamic_smem == registry.get("07_mma").dynamic_smem(MISSION)
    assert ok.occupancy.blocks_per_sm == registry.get("07_mma").tuning.defaults["ATTN07_MIN_CTAS"]
    reports = list(fresh_cache.glob("cubin/07_mma_swizzle-sm_89-*.ptxas"))
    assert reports and not list(fresh_cache.glob("cubin/07_mma_swizzle-sm_89-*.cubin")), \
        "the verdict's ptxas report is cached, the cubin nothing loads is not kept"
    # Eight warps kept at two CTAs per SM cap ptxas at 128 registers: the 64-key tile spills.
    spill = search.static_gate("07_mma", {"ATTN07_WARPS": 8, "ATTN07_BLOCK_N_D64": 64, "ATTN07_MIN_CTAS": 2}, 64,
                               "sm_89")
    assert not spill.ok and spill.compiled and spill.spill_bytes > 0 and "spills" in spill.problems[0]
    # Arithmetic refusals never reach the compiler.
    big = search.static_gate("06_warp_specialized", {**search.default_config("06_warp_specialized", 64),
                                                    "ATTN06_STAGES": 4}, 64)
    assert not big.ok and not big.compiled and "shared memory" in big.problems[0]


def test_configured_kernels_agree_with_the_registry_on_shared_memory(tmp_path):
    """The kernels' own smem_bytes<> under a configuration equals the registry's geometry: checked by
    static_asserts compiled into a translation unit that includes each kernel."""
    cases = [("05_wmma", {"ATTN_WMMA_BLOCK_M": 128, "ATTN05_BLOCK_N": 16}, "smem_bytes<{D}>()"),
             ("06_warp_specialized", {"ATTN_WMMA_BLOCK_M": 32, "ATTN06_BLOCK_N_D64": 32, "ATTN06_BLOCK_N_D128": 16,
                                      "ATTN06_STAGES": 3}, "smem_bytes<{D}, 3>()")]
    for kernel_id, config, expr in cases:
        spec = registry.get(kernel_id).with_config(config)
        asserts = "".join(f"static_assert({expr.format(D=D)} == {spec.dynamic_smem(Shape(1, 1, 9, D))}, "
                          f"\"D={D}\");\n" for D in (64, 128))
        unit = tmp_path / f"check_{kernel_id}.cu"
        unit.write_text(f'#include "{spec.source}"\n{asserts}')
        proc = subprocess.run([toolchain.nvcc(), "-arch=sm_89", "-cubin", "-std=c++17", *define_flags(spec.defines),
                               "-I", str(kernels_dir()), "-o", str(tmp_path / "x.cubin"), str(unit)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]


# --- records and the tuned launcher ----------------------------------------------------------------

import attnlab.records.results  # noqa: E402

_NEW_RECORD = attnlab.records.results.new_record  # before any test replaces it

def _search_record(monkeypatch, kernel_id="07_mma", shape=MISSION, causal=False, created="2026-01-03T00:00:00Z",
                   older_source=False, gpu="TEST GPU (NVIDIA L4 table entry)", cc="8.9", sms=58):
    """A search record built by search_record from a synthetic run (the GPU's provenance faked: its
    name, compute capability and SM count)."""
    import attnlab.records.results
    from synthetic import new_test_record, older, timing

    made = _NEW_RECORD

    def fake_new_record(kind, specs, settings=None):
        rec = new_test_record(kind, specs, settings, gpu=gpu, created=created, make=made, cc=cc, sms=sms)
        return older(rec) if older_source else rec

    monkeypatch.setattr(attnlab.records.results, "new_record", fake_new_record)
    candidates = search.valid_space(kernel_id, shape.D)
    default = search.default_config(kernel_id, shape.D)
    fast = next(c for c in candidates if c != default)
    times = {search._key(default): 50.0, search._key(fast): 40.0}
    def fitness(c):
        if c == candidates[-1]:
            return Trial(c, "static", reason="spills")
        t = timing(times.get(search._key(c), 60.0))
        return Trial(c, "ok", t["median_us"], detail={"device": t, "check": {"passed": True, "max_err": 1e-4}})
    result = exhaustive([default] + [c for c in candidates if c != default], fitness)
    return search.search_record(kernel_id, shape, causal, result, {"strategy": "exhaustive"}), fast


def test_search_record_is_valid_and_complete(monkeypatch):
    rec, fast = _search_record(monkeypatch)
    assert validate_record(attnlab.records.results.seal(rec)) == []
    s = rec["search"]
    assert s["best"] == {"config": fast, "time_us": 40.0} and s["default"]["time_us"] == 50.0
    assert len(rec["cases"]) == s["valid_size"] and s["counts"]["static"] == 1
    assert {c["status"] for c in rec["cases"]} == {"ok", "static"}
    bad = [dict(rec, cases=[dict(rec["cases"][0], status="ok", time_us=None)]),
           dict(rec, cases=[dict(rec["cases"][-1], time_us=3.0)]),
           dict(rec, cases=[dict(rec["cases"][0], status="fast")]),
           {k: v for k, v in rec.items() if k != "search"}]
    for b in bad:
        assert validate_record(b), b["cases"][:1]


def test_tuned_launcher_reads_fresh_search_records(monkeypatch, results):
    gpu = "TEST GPU (NVIDIA L4 table entry)"
    spec, why = tuned.spec_for("07_mma", MISSION, False, gpu=gpu)
    assert spec is registry.get("07_mma") and "no fresh search record" in why
    rec, fast = _search_record(monkeypatch)
    write_record(rec, results)
    spec, why = tuned.spec_for("07_mma", MISSION, False, gpu=gpu)
    assert spec.config == {**registry.get("07_mma").tuning.defaults, **fast} and "searched at (1, 8, 512, 64)" in why
    near, why = tuned.spec_for("07_mma", Shape(1, 8, 1024, 64), False, gpu=gpu)
    assert near.config == spec.config and "nearest length" in why
    assert tuned.spec_for("07_mma", MISSION, True, gpu=gpu)[0] is registry.get("07_mma")   # causal not searched
    assert tuned.spec_for("07_mma", MISSION, False, gpu="another GPU")[0] is registry.get("07_mma")
    assert (gpu, "07_mma", tuple(MISSION), False) in search.best_configs()
    # A newer search of a changed kernel (another hash) is stale: ignored, and the older fresh one stays.
    stale, _ = _search_record(monkeypatch, created="2026-02-01T00:00:00Z", older_source=True)
    write_record(stale, results)
    assert len(search.fresh_search_records()) == 1


def test_knob_effects_and_figures(monkeypatch):
    rec, _ = _search_record(monkeypatch)
    effects = search.knob_effects(rec)
    assert set(effects) == set(search.default_config("07_mma", 64))
    fig = search.plot_search(rec)
    assert len(fig.axes) == 1 + len(effects)
    verdicts = [search.StaticVerdict("07_mma", c, 64, "sm_89", 128, 40960, registers=150,
                                     occupancy=search.occupancy("sm_89", 128, 150, 40960))
                for c in search.space("07_mma", 64)]
    verdicts[0].problems = ["x spills on sm_89"]
    assert search.plot_static_space(verdicts).axes
