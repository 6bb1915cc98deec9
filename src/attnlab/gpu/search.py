"""Chapter 8: search the knobs of chapters 5-7 (tile shape, warps, pipeline stages).

A configuration is a dict of the preprocessor defines a kernel reads (`registry.Knob`), e.g.
{"ATTN07_WARPS": 8, "ATTN07_BLOCK_N_D64": 32, "ATTN07_MIN_CTAS": 1}. The registry builds the
kernel that way (`KernelSpec.with_config`): the same source, the same entry points, launch
geometry computed from the same values. This module walks those spaces in four steps, cheapest
first, so that no GPU time goes to a configuration the compiler could have refused:

1. the space: every combination of the knob values that matter at head dim D, minus those the
   kernel's compile-time rules or the shared memory per block of the GPU at hand (the L4's 99 KB
   without a GPU) refuse (arithmetic);
2. the static gate: nvcc builds each remaining configuration for the target and ptxas says how
   many registers it needs and whether it spills; a spill, or shared memory over the limit, ends
   it there. The registers, shared memory and threads give its theoretical occupancy;
3. the correctness gate (on a GPU): the FlashAttention pass rule of attnlab.gpu.check on poisoned
   output; a configuration that fails it is never timed and never enters a population;
4. fitness (on a GPU): median device time from CUDA-graph replays (attnlab.gpu.bench).

Two strategies share one fitness interface, `fitness(config) -> Trial`, so the loop runs on a CPU
with a synthetic fitness (tests/test_search.py) exactly as it runs on a GPU with the real one:
`exhaustive` tries every valid configuration in order, `evolve` is an elitist evolutionary loop in
the spirit of EvoEngineer (a population, tournament selection, crossover and mutation of knob
values, the `elite` best always kept). Both stop when the time budget is spent (no evaluation
starts after it), and never evaluate a configuration twice. Every configuration tried goes into a
record of kind "search"; the best one per (GPU, kernel, shape, causal) is what attnlab.gpu.tuned
launches.
"""
from __future__ import annotations

import itertools
import math
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..kernels import registry, toolchain
from ..gpus import SM_LIMITS, Occupancy, occupancy  # noqa: F401 (chapter 8 reads them here)
from ..gpus import max_smem_per_block
from ..kernels.registry import KernelSpec
from ..shapes import MISSION, Shape

REFERENCE_ARCH = "sm_89"      # the L4's: the static gate's default target
EXHAUSTIVE_MAX = 24           # "auto" sweeps spaces up to this size, and evolves larger ones
STATUSES = ("ok", "static", "failed", "error")


# --- the space ---------------------------------------------------------------------------------

def searchable() -> list[str]:
    """Registered chapter kernels that have knobs, in chapter order (their ablations and variants
    carry the knobs too, to take the chapter kernel's tiles on each GPU, but are not searched)."""
    return [s.id for s in registry.select(None) if s.tuning is not None and s.variant_of is None]


def _tunable(kernel_id: str) -> KernelSpec:
    spec = registry.get(kernel_id)
    if kernel_id not in searchable():
        raise ValueError(f"{kernel_id} has no knobs to search; searchable: {', '.join(searchable())}")
    return spec


def knobs_for(kernel_id: str, D: int) -> tuple[registry.Knob, ...]:
    """The knobs that change the code run at head dim D (others stay at their defaults)."""
    return tuple(k for k in _tunable(kernel_id).tuning.knobs if k.head_dim in (None, D))


def default_config(kernel_id: str, D: int, arch: str | None = None) -> dict[str, int]:
    """The chapter's configuration at D on `arch` (the GPU at hand's by default): the source's
    constants, with chapter 7's key tiles following the architecture."""
    config = registry.get(kernel_id, arch).config
    return {k.name: config[k.name] for k in knobs_for(kernel_id, D)}


def space(kernel_id: str, D: int) -> list[dict[str, int]]:
    """Every combination of the values of the knobs that matter at D, in a fixed order."""
    knobs = knobs_for(kernel_id, D)
    return [dict(zip((k.name for k in knobs), values)) for values in itertools.product(*(k.values for k in knobs))]


def arithmetic_problems(kernel_id: str, config: dict, D: int, arch: str | None = None) -> list[str]:
    """Why the kernel cannot be built or launched with `config` at D on `arch` (the GPU at hand's
    by default), known without compiling."""
    return registry.get(kernel_id, arch).with_config(config).config_problems(D, arch)


def valid_space(kernel_id: str, D: int, arch: str | None = None) -> list[dict[str, int]]:
    """The configurations that pass the arithmetic rules at D on `arch` (the GPU at hand's by
    default): what the search may try."""
    return [c for c in space(kernel_id, D) if not arithmetic_problems(kernel_id, c, D, arch)]


def config_text(config: dict, kernel_id: str | None = None, D: int | None = None) -> str:
    """A configuration in a few words: the knobs that differ from the kernel's defaults (all of
    them without a kernel), or "default"."""
    base = _tunable(kernel_id).config if kernel_id else {}  # the chapter's, on the GPU at hand
    items = [f"{_short(n)}={v}" for n, v in config.items() if base.get(n) != v]
    return ", ".join(items) or "default"


def _short(name: str) -> str:
    """ATTN07_BLOCK_N_D64 -> BLOCK_N_D64; ATTN_WMMA_BLOCK_M -> BLOCK_M."""
    for prefix in ("ATTN_WMMA_", "ATTN05_", "ATTN06_", "ATTN07_", "ATTN_"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


# --- the static gate ---------------------------------------------------------------------------

@dataclass
class StaticVerdict:
    kernel: str
    config: dict
    D: int
    arch: str
    threads: int
    dynamic_smem: int
    registers: int | None = None
    static_smem: int = 0
    spill_bytes: int = 0
    stack_bytes: int = 0
    occupancy: Occupancy | None = None
    problems: list[str] = field(default_factory=list)
    compiled: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def smem(self) -> int:
        return self.static_smem + self.dynamic_smem

    def to_dict(self) -> dict:
        d = asdict(self)
        d["occupancy"] = None if self.occupancy is None else {**asdict(self.occupancy),
                                                               "fraction": self.occupancy.fraction}
        return d


def _ptxas_functions(spec: KernelSpec, arch: str) -> list[dict]:
    """ptxas's report of every function of a (configured) kernel for `arch`, from the build cache
    (keyed by source, configuration, target, flags and nvcc's version)."""
    from ..kernels.compile import ptxas_report
    from ..kernels.static import parse_ptxas

    return [asdict(f) for f in parse_ptxas(ptxas_report(spec, arch))]


def static_gate(kernel_id: str, config: dict, D: int, arch: str | None = None) -> StaticVerdict:
    """What the compiler says about one configuration at head dim D, before any GPU time.

    Refused without compiling when the arithmetic rules refuse it; otherwise built with nvcc for
    `arch` (with chapter 7's key tiles for `arch` where `config` leaves them), and refused when an
    entry that may run D (one per key split) spills registers or needs more shared memory per block
    than `arch` allows (99 KB on sm_89, 227 KB on sm_90). ptxas reports one register
    count per entry: for kernels whose entry holds both head dims (chapters 5 and 6) it is the
    larger of the two paths."""
    from ..gpus import arch_at_hand
    from ..kernels.compile import KernelBuildError

    arch = arch or arch_at_hand()[0]  # the GPU at hand's (the L4's sm_89 without one)
    spec = registry.get(kernel_id, arch).with_config(config)
    shape = Shape(1, 1, 1, D)
    verdict = StaticVerdict(kernel_id, dict(config), D, arch, threads=math.prod(spec.block(shape)),
                            dynamic_smem=spec.dynamic_smem(shape))
    verdict.problems = spec.config_problems(D, arch)
    if verdict.problems or not toolchain.has_nvcc():
        # Without nvcc (a GPU machine with NVRTC only) the arithmetic rules are all that can be said
        # before a build: DeviceFitness then reads the loaded kernel's attributes instead.
        return verdict
    try:
        functions = _ptxas_functions(spec, arch)
    except KernelBuildError as exc:
        verdict.problems = [f"nvcc refused it: {str(exc).splitlines()[-1][:200]}"]
        return verdict
    verdict.compiled = True
    by_name = {f["name"]: f for f in functions}
    # Every entry that may run D (chapter 7: one per key split, the launcher's choice per shape).
    entries = spec.entries_at_head_dim(D)
    missing = [e for e in entries if e not in by_name]
    if missing:
        verdict.problems = [f"entry {', '.join(missing)} not in the build"]
        return verdict
    verdict.registers = max(by_name[e]["registers"] for e in entries)
    verdict.static_smem = max(by_name[e]["static_smem"] for e in entries)
    verdict.spill_bytes = sum(by_name[e]["spill_stores"] + by_name[e]["spill_loads"] for e in entries)
    verdict.stack_bytes = max(by_name[e]["stack_bytes"] for e in entries)
    for entry in entries:
        fn = by_name[entry]
        if fn["spill_stores"] + fn["spill_loads"]:
            verdict.problems.append(f"{entry} spills on {arch}: {fn['spill_stores']} B stored, "
                                    f"{fn['spill_loads']} B loaded ({fn['registers']} registers)")
    limit, whose = max_smem_per_block(arch)
    if verdict.smem > limit:
        verdict.problems.append(f"{verdict.smem} B of shared memory, over {whose} {limit} B per block")
    if arch in SM_LIMITS and verdict.smem <= SM_LIMITS[arch].smem:
        verdict.occupancy = occupancy(arch, verdict.threads, verdict.registers, verdict.smem)
    return verdict


def static_space(kernel_id: str, D: int, arch: str = REFERENCE_ARCH, workers: int | None = None,
                 progress: bool = False) -> list[StaticVerdict]:
    """The static gate over the whole space at D (arithmetic refusals included, not compiled),
    nvcc builds running in parallel, one per core."""
    from tqdm import tqdm

    configs = space(kernel_id, D)
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
        jobs = pool.map(lambda c: static_gate(kernel_id, c, D, arch), configs)
        return list(tqdm(jobs, total=len(configs), desc=f"static {kernel_id} D={D}", unit="config",
                         disable=not progress))


# --- trials and strategies ---------------------------------------------------------------------

@dataclass
class Trial:
    """One configuration tried: `status` "ok" (passed the correctness gate, then timed), "static"
    (refused by the static gate), "failed" (wrong output) or "error" (did not build or launch)."""
    config: dict
    status: str
    time_us: float | None = None
    reason: str = ""
    detail: dict = field(default_factory=dict)
    generation: int = 0

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")
        if self.status == "ok" and not (isinstance(self.time_us, (int, float)) and self.time_us > 0
                                        and math.isfinite(self.time_us)):
            raise ValueError(f"an ok trial needs a positive time, not {self.time_us!r}")
        if self.status != "ok":
            self.time_us = None

    @property
    def admitted(self) -> bool:
        """Only a configuration that passed every gate may enter a population or be the best."""
        return self.status == "ok"


Fitness = Callable[[dict], Trial]


@dataclass
class SearchResult:
    strategy: str
    trials: list[Trial]
    stopped: str                                   # "space exhausted", "budget" or "generations"
    elapsed_s: float
    populations: list[list[dict]] = field(default_factory=list)  # evolve: after each generation, best first

    @property
    def best(self) -> Trial | None:
        ok = [t for t in self.trials if t.admitted]
        return min(ok, key=lambda t: t.time_us) if ok else None

    def counts(self) -> dict[str, int]:
        return {s: sum(t.status == s for t in self.trials) for s in STATUSES}


def _key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


class _BudgetSpent(Exception):
    pass


class _Runner:
    """Evaluates configurations once each, within the time budget, with a progress bar."""

    def __init__(self, fitness: Fitness, budget_s: float | None, clock, bar):
        self.fitness, self.budget_s, self.clock, self.bar = fitness, budget_s, clock, bar
        self.t0 = clock()
        self.tried: dict[tuple, Trial] = {}
        self.order: list[Trial] = []

    def spent(self) -> bool:
        return self.budget_s is not None and self.clock() - self.t0 >= self.budget_s

    def __call__(self, config: dict, generation: int = 0) -> Trial:
        if self.spent():
            raise _BudgetSpent
        trial = self.fitness(dict(config))
        trial.generation = generation
        self.tried[_key(config)] = trial
        self.order.append(trial)
        self.bar.update(1)
        best = min((t.time_us for t in self.order if t.admitted), default=None)
        if best is not None:
            self.bar.set_postfix_str(f"best {best:.1f} us")
        return trial

    def elapsed(self) -> float:
        return self.clock() - self.t0


def exhaustive(candidates: Iterable[dict], fitness: Fitness, budget_s: float | None = None,
               clock=time.monotonic, progress: bool = False) -> SearchResult:
    """Try every candidate once, in order, until the list or the budget ends."""
    from tqdm import tqdm

    candidates = list(candidates)
    with tqdm(total=len(candidates), desc="exhaustive", unit="config", disable=not progress) as bar:
        run = _Runner(fitness, budget_s, clock, bar)
        stopped = "space exhausted"
        try:
            for config in candidates:
                if _key(config) not in run.tried:
                    run(config)
        except _BudgetSpent:
            stopped = "budget"
    return SearchResult("exhaustive", run.order, stopped, run.elapsed())


def evolve(candidates: Iterable[dict], fitness: Fitness, seed: int = 0, population: int = 8, elite: int = 2,
           generations: int = 10, budget_s: float | None = None, start: Iterable[dict] = (),
           crossover: float = 0.5, clock=time.monotonic, progress: bool = False) -> SearchResult:
    """An elitist evolutionary search over the candidates (every dict has the same keys).

    Generation 0 evaluates `start` (e.g. the chapter's default) and random candidates up to
    `population`. Each later generation breeds `population` children: two tournament winners
    crossed (uniform, with probability `crossover`) or one mutated (one or two knobs moved to
    another value), kept only if the child is a valid candidate not tried before, else a random
    untried candidate takes its place. The next population is the `elite` best of the current one,
    always, then the best admitted children, then the rest of the current one, `population` in all.
    Only configurations that passed every gate (Trial.admitted) enter a population. Deterministic
    for a given seed (and fitness)."""
    from tqdm import tqdm

    if not 0 <= elite <= population or population < 1:
        raise ValueError("need population >= 1 and 0 <= elite <= population")
    rng = random.Random(seed)
    candidates = list(candidates)
    valid = {_key(c): c for c in candidates}
    keys = list(candidates[0]) if candidates else []
    values = {k: sorted({c[k] for c in candidates}) for k in keys}
    populations: list[list[dict]] = []

    def untried() -> list[dict]:
        return [c for k, c in valid.items() if k not in run.tried]

    def rank(trials: list[Trial]) -> list[Trial]:
        return sorted(trials, key=lambda t: (t.time_us, run.order.index(t)))

    def tournament(pop: list[Trial]) -> Trial:
        if len(pop) == 1:
            return pop[0]
        a, b = rng.sample(pop, 2)
        return a if (a.time_us, run.order.index(a)) <= (b.time_us, run.order.index(b)) else b

    def mutate(config: dict) -> dict | None:
        for _ in range(20):
            child = dict(config)
            for knob in rng.sample(keys, min(len(keys), 1 + (rng.random() < 0.3))):
                options = [v for v in values[knob] if v != config[knob]]
                if options:
                    child[knob] = rng.choice(options)
            if _key(child) in valid and _key(child) not in run.tried:
                return child
        return None

    def breed(pop: list[Trial]) -> dict | None:
        child = None
        if len(pop) >= 2 and rng.random() < crossover:
            a, b = tournament(pop).config, tournament(pop).config
            child = {k: (a[k] if rng.random() < 0.5 else b[k]) for k in keys}
            if _key(child) not in valid or _key(child) in run.tried:
                child = mutate(child)
        elif pop:
            child = mutate(tournament(pop).config)
        if child is None:
            rest = untried()
            child = rng.choice(rest) if rest else None
        return child

    with tqdm(total=min(len(candidates), population * (generations + 1)), desc="evolve", unit="config",
              disable=not progress) as bar:
        run = _Runner(fitness, budget_s, clock, bar)
        pop: list[Trial] = []
        stopped = "generations"
        try:
            first = [c for c in start if _key(c) in valid]
            first = list({_key(c): c for c in first}.values())[:population]
            rest = [c for c in candidates if _key(c) not in {_key(f) for f in first}]
            first += rng.sample(rest, min(population - len(first), len(rest)))
            for config in first:
                pop.append(run(config, 0))
            # Nothing admitted yet (every start failed a gate): draw until something passes.
            while not any(t.admitted for t in pop) and untried():
                pop.append(run(rng.choice(untried()), 0))
            pop = rank([t for t in pop if t.admitted])[:population]
            populations.append([t.config for t in pop])
            for generation in range(1, generations + 1):
                if not untried():
                    stopped = "space exhausted"
                    break
                children = []
                for _ in range(population):
                    child = breed(pop)
                    if child is None:
                        break
                    children.append(run(child, generation))
                admitted = rank([t for t in children if t.admitted])
                keep = pop[:elite]
                nxt = keep + admitted[:population - len(keep)]
                nxt += [t for t in pop[elite:] if t not in nxt][:population - len(nxt)]
                pop = rank(nxt)
                populations.append([t.config for t in pop])
            else:
                if not untried():
                    stopped = "space exhausted"
        except _BudgetSpent:
            stopped = "budget"
            if pop and (not populations or populations[-1] != [t.config for t in pop]):
                populations.append([t.config for t in rank([t for t in pop if t.admitted])])
    return SearchResult("evolve", run.order, stopped, run.elapsed(), populations)


# --- on a GPU ------------------------------------------------------------------------------------

def _device_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


class DeviceFitness:
    """The real fitness on the GPU at hand: the static gate (no GPU time), then the correctness
    gate on poisoned output (attnlab.pass_rule.judge), then the median device time of CUDA-graph
    replays (attnlab.gpu.bench.device_time). Inputs, reference and tolerance are made once."""

    def __init__(self, kernel_id: str, shape: Shape = MISSION, causal: bool = False, reps: int = 30,
                 arch: str | None = None):
        import torch

        from ..env import require_gpu
        from ..kernels.contract import validate
        from ..pass_rule import make_inputs
        from ..reference import naive_fp16, reference_attention

        require_gpu("a search's fitness")
        self.kernel_id, self.shape, self.causal, self.reps = kernel_id, Shape(*shape), causal, reps
        self.arch = arch or _device_arch()
        self.q, self.k, self.v = make_inputs(self.shape, seed=0)
        validate(registry.get(kernel_id), self.q, self.k, self.v, causal)
        self.ref = reference_attention(self.q, self.k, self.v, causal)
        self.fp16_err = float((naive_fp16(self.q, self.k, self.v, causal).double() - self.ref).abs().max())
        self.scale = 1.0 / math.sqrt(self.shape.D)
        self.out = torch.empty_like(self.q)

    def __call__(self, config: dict) -> Trial:
        import torch

        from ..pass_rule import judge
        from .bench import device_time
        from .launch import launch

        verdict = static_gate(self.kernel_id, config, self.shape.D, self.arch)
        detail = {"static": verdict.to_dict()}
        if not verdict.ok:
            return Trial(config, "static", reason="; ".join(verdict.problems), detail=detail)
        spec = registry.get(self.kernel_id).with_config(config)
        run = lambda: launch(spec, self.shape, self.q, self.k, self.v, self.out, self.causal, self.scale)  # noqa: E731
        try:
            if not verdict.compiled:  # no nvcc here: ask the loaded (NVRTC-built) kernel about spills
                from ..kernels.compile import load_function

                attrs = load_function(spec, spec.entry_at(self.shape)).attributes
                detail["static"]["registers"] = attrs.get("num_regs")
                if attrs.get("local_size_bytes", 0):
                    return Trial(config, "static", reason=f"uses {attrs['local_size_bytes']} B of local memory "
                                 "per thread (spills)", detail=detail)
            self.out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
        except Exception as exc:  # a build or launch failure is this configuration's result
            return Trial(config, "error", reason=f"{type(exc).__name__}: {str(exc)[:300]}", detail=detail)
        v = judge(self.out, self.ref, self.fp16_err)
        detail["check"] = {"passed": v.passed, "max_err": v.max_err, "tolerance": v.tolerance, "reason": v.reason}
        if not v.passed:
            return Trial(config, "failed", reason=v.reason, detail=detail)
        timing = device_time(run, reps=self.reps)
        detail["device"] = timing.to_dict()
        return Trial(config, "ok", timing.median_us, detail=detail)


def trial_case(kernel_id: str, shape: Shape, causal: bool, trial: Trial) -> dict:
    """One configuration as a case of a search record."""
    return {"kernel": kernel_id, "shape": list(shape), "causal": causal, "config": dict(trial.config),
            "status": trial.status, "time_us": trial.time_us, "generation": trial.generation,
            "reason": trial.reason, **{k: trial.detail.get(k) for k in ("static", "check", "device")}}


def search_record(kernel_id: str, shape: Shape, causal: bool, result: SearchResult, settings: dict) -> dict:
    """A record of kind "search" (attnlab.records.results) holding every configuration tried."""
    from ..records.results import new_record

    spec = registry.get(kernel_id)
    record = new_record("search", [spec], settings=settings)
    default = default_config(kernel_id, shape.D)
    base = next((t for t in result.trials if t.config == default), None)
    best = result.best
    record["search"] = {
        "kernel": kernel_id, "shape": list(shape), "causal": causal, "strategy": result.strategy,
        "stopped": result.stopped, "elapsed_s": result.elapsed_s, "counts": result.counts(),
        "space_size": len(space(kernel_id, shape.D)), "valid_size": len(valid_space(kernel_id, shape.D)),
        "best": None if best is None else {"config": best.config, "time_us": best.time_us},
        "default": None if base is None else {"config": base.config, "status": base.status, "time_us": base.time_us},
        "populations": result.populations,
    }
    record["cases"] = [trial_case(kernel_id, shape, causal, t) for t in result.trials]
    return record


def run_search(kernel_id: str, shape: Shape = MISSION, causal: bool = False, strategy: str = "auto",
               budget_s: float = 300.0, seed: int = 0, population: int = 8, elite: int = 2,
               generations: int = 6, reps: int = 30, progress: bool = True) -> dict:
    """Search one kernel's knobs at one shape on this GPU; returns the record (not yet written)."""
    from ..env import require_gpu

    require_gpu("a search")
    shape = Shape(*shape)
    candidates = valid_space(kernel_id, shape.D)
    if strategy == "auto":
        strategy = "exhaustive" if len(candidates) <= EXHAUSTIVE_MAX else "evolve"
    fitness = DeviceFitness(kernel_id, shape, causal, reps)
    default = default_config(kernel_id, shape.D)
    if strategy == "exhaustive":
        ordered = [default] + [c for c in candidates if c != default]
        result = exhaustive(ordered, fitness, budget_s, progress=progress)
    elif strategy == "evolve":
        result = evolve(candidates, fitness, seed=seed, population=population, elite=elite,
                        generations=generations, budget_s=budget_s, start=[default], progress=progress)
    else:
        raise ValueError(f"strategy must be auto, exhaustive or evolve, not {strategy!r}")
    settings = {"strategy": strategy, "budget_s": budget_s, "seed": seed, "population": population,
                "elite": elite, "generations": generations, "reps": reps, "arch": fitness.arch,
                "timer": "cuda events around cuda-graph replays", "l2": "warm"}
    return search_record(kernel_id, shape, causal, result, settings)


# --- reading search records ----------------------------------------------------------------------

def fresh_search_records(root: Path | None = None) -> list[dict]:
    """Search records whose kernel still hashes to what was searched, oldest first."""
    from ..records.results import fresh_records

    return fresh_records("search", root)


def best_configs(root: Path | None = None) -> dict[tuple, dict]:
    """(GPU name, kernel, shape, causal) -> the best configuration the newest fresh search found:
    {"config", "time_us", "default_us", "recorded_utc"}. Searches that admitted nothing are left out."""
    table = {}
    for rec in fresh_search_records(root):  # oldest first: newer searches overwrite
        s = rec["search"]
        if not s.get("best"):
            continue
        key = (rec["gpu"]["name"], s["kernel"], tuple(s["shape"]), bool(s["causal"]))
        default = s.get("default") or {}
        table[key] = {"config": dict(s["best"]["config"]), "time_us": s["best"]["time_us"],
                      "default_us": default.get("time_us"), "recorded_utc": rec["created_utc"]}
    return table


def knob_effects(record: dict) -> dict[str, dict[int, list[float]]]:
    """knob -> value -> device times (µs) of the admitted configurations that had that value."""
    effects: dict[str, dict[int, list[float]]] = {}
    for case in record["cases"]:
        if case["status"] != "ok":
            continue
        for name, value in case["config"].items():
            effects.setdefault(name, {}).setdefault(value, []).append(case["time_us"])
    return effects


# --- figures -------------------------------------------------------------------------------------

def plot_static_space(verdicts: list[StaticVerdict], title: str = ""):
    """One heat map of a space at one D: the first half of the knobs down, the rest across. A cell
    shows the registers and resident blocks per SM of a configuration the static gate passed
    (colour: theoretical occupancy), or why it was refused. The chapter's default is outlined."""
    import matplotlib.pyplot as plt
    import numpy as np

    kernel_id, D = verdicts[0].kernel, verdicts[0].D
    knobs = knobs_for(kernel_id, D)
    rows_k, cols_k = knobs[:max(1, len(knobs) // 2)], knobs[max(1, len(knobs) // 2):]
    rows = list(itertools.product(*(k.values for k in rows_k)))
    cols = list(itertools.product(*(k.values for k in cols_k))) or [()]
    grid = np.full((len(rows), len(cols)), np.nan)
    fig, ax = plt.subplots(figsize=(1.6 + 1.15 * len(cols), 1.3 + 0.5 * len(rows)))  # room for two-line labels
    default = default_config(kernel_id, D, verdicts[0].arch)
    for v in verdicts:
        r = rows.index(tuple(v.config[k.name] for k in rows_k))
        c = cols.index(tuple(v.config[k.name] for k in cols_k))
        if v.ok and v.occupancy is not None:
            grid[r, c] = v.occupancy.fraction
            text = f"{v.registers} reg\n{v.occupancy.blocks_per_sm} blk/SM"
        else:
            reason = v.problems[0] if v.problems else ""
            text = ("spill" if "spill" in reason else "CTAs" if "CTA(s) share" in reason
                    else "smem" if "shared memory" in reason else "nvcc" if "nvcc" in reason else "rule")
        ax.text(c, r, text, ha="center", va="center", fontsize=6.5, color="black" if v.ok else "dimgray")
        if v.config == default:
            ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, lw=2, ec="black"))
    masked = np.ma.masked_invalid(grid)
    cmap = plt.get_cmap("YlGn").with_extremes(bad="#e6e6e6")
    im = ax.imshow(masked, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_yticks(range(len(rows)), [", ".join(f"{_short(k.name)}={x}" for k, x in zip(rows_k, row)) for row in rows],
                  fontsize=7)
    ax.set_xticks(range(len(cols)), ["\n".join(f"{_short(k.name)}={x}" for k, x in zip(cols_k, col)) for col in cols],
                  fontsize=6.5)
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02).set_label("theoretical occupancy", fontsize=7)
    arch = verdicts[0].arch
    ax.set_title(title or f"{kernel_id}, D={D}, {arch}: registers and blocks per SM\n"
                 f"(grey: refused; outlined: the chapter's default)", fontsize=8)
    fig.tight_layout()
    return fig


def plot_search(record: dict):
    """A search record: every configuration's device time in the order tried (refused and failed
    ones marked at the bottom), the default and the best; and, per knob, the times by value."""
    import matplotlib.pyplot as plt

    s = record["search"]
    cases = record["cases"]
    effects = knob_effects(record)
    fig, axes = plt.subplots(1, 1 + len(effects), figsize=(4.2 + 1.9 * len(effects), 3.4),
                             gridspec_kw={"width_ratios": [2.2] + [1] * len(effects)})
    axes = list(axes) if len(effects) else [axes]
    ax = axes[0]
    ok = [(i, c["time_us"]) for i, c in enumerate(cases) if c["status"] == "ok"]
    bad = [i for i, c in enumerate(cases) if c["status"] != "ok"]
    ax.scatter([i for i, _ in ok], [t for _, t in ok], s=14, c=[cases[i]["generation"] for i, _ in ok],
               cmap="viridis", label="checked and timed")
    if ok:
        low = min(t for _, t in ok)
        ax.scatter(bad, [low * 0.9] * len(bad), marker="x", color="tab:red", s=14,
                   label="refused or wrong (no time)")
    if s.get("default") and s["default"].get("time_us"):
        ax.axhline(s["default"]["time_us"], color="black", ls="--", lw=1, label="chapter's default")
    if s.get("best"):
        ax.axhline(s["best"]["time_us"], color="tab:green", lw=1, label="best")
    ax.set_xlabel("configuration, in the order tried")
    ax.set_ylabel("device time, µs")
    ax.legend(fontsize=6.5)
    ax.set_title(f"{s['kernel']} {Shape(*s['shape']).label()} causal={s['causal']} ({s['strategy']})\n"
                 f"{record['gpu']['name']}, {record['created_utc'][:10]}", fontsize=8)
    for ax, (name, by_value) in zip(axes[1:], effects.items()):
        vals = sorted(by_value)
        for x, v in enumerate(vals):
            ax.scatter([x] * len(by_value[v]), by_value[v], s=10, alpha=0.7)
        ax.set_xticks(range(len(vals)), [str(v) for v in vals])
        ax.set_xlabel(_short(name), fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig
