"""What the registry is made of: a kernel's spec (KernelSpec, with its Knobs and Tuning), the table
they are registered in (KERNELS), and the lookups that build a registered kernel for a GPU (get,
by_label, select). The chapters' modules (attnlab.kernels.chapters) register into it;
attnlab.kernels.registry is the table as everything else reads it.

Kernels with knobs (chapters 5-7: tile shape, warps, pipeline stages) also carry a `Tuning`: the
preprocessor defines their source reads (each `#ifdef NAME` around the chapter's constant) and one
geometry function of those values. `spec.with_config({"ATTN07_WARPS": 8})` returns the kernel built
that way: a copy whose `defines` reach the compiler (attnlab.kernels.compile) and whose block, grid and
dynamic shared memory follow from the same values, so the launcher runs it unchanged. Chapter 8's
search (attnlab.gpu.search) walks these spaces.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

from ..gpus import max_smem_per_block
from ..paths import kernels_dir
from ..shapes import Shape

DEFAULT_SMEM_LIMIT = 48 * 1024  # per block without the opt-in


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Knob:
    """One compile-time constant a kernel lets chapter 8's search set: the source reads the
    preprocessor define `name` when it is given and keeps the chapter's value (`default`) otherwise."""
    name: str                       # the define, e.g. "ATTN07_WARPS"
    values: tuple[int, ...]         # what the search may try (the default among them)
    default: int
    label: str                      # for tables and plots: "warps", "keys per tile (D=64)", ...
    head_dim: int | None = None     # the knob shapes only this head dim's code; None: every D


@dataclass(frozen=True)
class Tuning:
    """The knobs of a kernel and what follows from them.

    geometry(config) -> {"block": f, "grid": f, "dynamic_smem": f[, "kv_split": f, "at_split": g,
    "head_dims": set]}, each f a function of the Shape (g of the Shape and a split): the one description
    of the launch for every configuration, the chapter's included.
    rules(config, D) -> the reasons the kernel's static_asserts would refuse the configuration at
    head dim D (shared memory is checked separately, from the geometry).
    arch_defaults(arch) -> the knob values the chapter takes on architecture sm_XY where they differ
    from `defaults` (the values in the source, the L4's): chapter 7's key tile and stages follow
    the shared memory of the GPU at hand. None: the same values on every GPU.
    min_ctas: the knob that promises ptxas that many resident CTAs per SM (`__launch_bounds__`'s
    second argument, which sets the registers each thread may take); a configuration whose shared
    memory lets fewer CTAs share an SM breaks the promise and is refused. None: no such knob."""
    knobs: tuple[Knob, ...]
    geometry: Callable[[dict], dict]
    rules: Callable[[dict, int], list[str]] = lambda config, D: []
    arch_defaults: Callable[[str], dict] | None = None
    min_ctas: str | None = None

    @property
    def defaults(self) -> dict[str, int]:
        return {k.name: k.default for k in self.knobs}

    def defaults_on(self, arch: str | None) -> dict[str, int]:
        """The chapter's configuration on `arch` (None: the source's own values)."""
        if arch is None or self.arch_defaults is None:
            return self.defaults
        return {**self.defaults, **self.arch_defaults(arch)}

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(name)


@dataclass(frozen=True)
class KernelSpec:
    id: str
    chapter: int
    title: str
    source: str                                # file under kernels/
    entry: str                                 # extern "C" entry point
    block: Callable[[Shape], tuple[int, int, int]]
    grid: Callable[[Shape], tuple[int, int, int]]
    dynamic_smem: Callable[[Shape], int] = lambda s: 0
    head_dims: frozenset[int] | None = None    # None: any D in 1..max_head_dim
    max_head_dim: int = 128
    causal: bool = True
    max_len: int | None = None                 # None: any L >= 1
    summary: str = ""
    extra_sources: tuple[str, ...] = field(default=("common.cuh",))
    # Bytes every data pointer (q, k, v, out) must be a multiple of: 16 for kernels that load
    # 16-byte vectors (a contiguous view with a storage offset can break it). Checked before launch.
    alignment: int = 2
    # "module:function" that runs the whole computation around this kernel, for kernels that are
    # one step of it (the chapter 4 hybrid); None: the fused (q, k, v, o, L, D, scale, causal) launch.
    runner: str | None = None
    # Entries the runner launches besides the one launch_config names (FlashAttention-2's combine
    # kernel): built, inspected and profiled with the others, never launched on their own.
    helper_entries: tuple[str, ...] = ()
    # Kernels compiled once per head dim: D -> extern "C" entry (then `entry` is one of them);
    # None: `entry` serves every supported D.
    entries_by_head_dim: dict[int, str] | None = field(default=None, hash=False)
    # Knobs chapter 8 may set (None: the kernel has none), and the configuration this spec is built
    # with: sorted (define, value) pairs, empty for the chapter's own constants.
    tuning: Tuning | None = field(default=None, hash=False, compare=False)
    defines: tuple[tuple[str, int], ...] = ()
    # Kinds of shared-memory access ("ldmatrix", "cp.async", "ld/st") the chapter says never
    # conflict on banks; the CPU executor counts them and the CPU suite holds the kernel to it.
    conflict_free: tuple[str, ...] = ()
    # The chapter kernel this one is an ablation or a sweep variant of (None: a chapter's own kernel).
    # Sessions on a GPU run the chapters' own kernels first and these last.
    variant_of: str | None = None
    # Kernels that split each query tile's keys among warp groups of the CTA (chapter 7): the split
    # the launcher takes for a shape on the GPU at hand, and split -> (D -> entry) for every split
    # but 1 (whose entries are `entries_by_head_dim`). None: one split, 1, or the spec's own.
    # kv_split(shape, sms=None): sms names another GPU's SM count than the one at hand's.
    kv_split: Callable[..., int] = field(default=lambda s, sms=None: 1, hash=False, compare=False)
    entries_by_split: dict[int, dict[int, str]] | None = field(default=None, hash=False)
    # For those kernels, (shape, split) -> {"grid", "dynamic_smem"} at a given split: launch_config
    # takes the split once and derives the rest from it (one SM-count query per launch, not four).
    at_split: Callable[[Shape, int], dict] | None = field(default=None, hash=False, compare=False)
    # With the causal mask, CTA i of the launch takes query tile i / (B H) of (batch, head) pair
    # i % (B H), every pair's longest tile first (chapter 7's step 7.8); otherwise pair y takes the
    # CTAs of grid row y. The executor's one-head counts follow it (attnlab.executor.trace).
    causal_heads_first: bool = False
    # Kernels whose launcher picks, per shape, which of other registered kernels' launches runs the
    # shape (chapter 7's step 7.9: two row blocks per warp only where their grid fills the GPU): the
    # ids, each built from the same source with the same knobs, and choice(shape, sms=None) -> the
    # index of the one that runs it (sms: as kv_split). Read a launch through runs(): its entry,
    # grid, key split and order are the chosen kernel's. Empty: the spec's own launch.
    alternatives: tuple[str, ...] = ()
    choice: Callable[..., int] | None = field(default=None, hash=False, compare=False)
    # The architecture (sm_XY) whose tiles this build takes (for_arch); None: the source's own
    # constants, which are the L4's. `get` hands out every kernel built for the GPU at hand.
    arch: str | None = None

    @property
    def path(self):
        return kernels_dir() / self.source

    @property
    def tiles_follow_arch(self) -> bool:
        """Whether the kernel's tiles depend on the target (chapter 7's key tile and K/V stages do)."""
        return self.tuning is not None and self.tuning.arch_defaults is not None

    @property
    def config(self) -> dict[str, int]:
        """Every knob's value in this build (the defaults overlaid with `defines`); {} without knobs."""
        if self.tuning is None:
            return {}
        return {**self.tuning.defaults_on(self.arch), **dict(self.defines)}

    def with_config(self, config) -> "KernelSpec":
        """This kernel built with `config` (a dict or (define, value) pairs; knobs not named keep
        their values): a copy whose `defines` name every knob for the compiler and whose block, grid
        and dynamic shared memory are the tuning's geometry of the same values. The chapter's own
        configuration returns the registered spec itself. An unknown knob, or a value the knob does
        not list, is a ValueError."""
        given = dict(config.items() if isinstance(config, dict) else config)
        if not given:
            return self
        if self.tuning is None:
            raise ValueError(f"{self.id} has no knobs; it cannot take {sorted(given)}")
        known = {k.name: k for k in self.tuning.knobs}
        for name, value in given.items():
            if name not in known:
                raise ValueError(f"{self.id} has no knob {name!r}; its knobs: {', '.join(known)}")
            if value not in known[name].values:
                raise ValueError(f"{self.id}: {name}={value!r} is not one of {known[name].values}")
        full = {**self.config, **{n: int(v) for n, v in given.items()}}
        if full == self.tuning.defaults_on(self.arch):
            registered = KERNELS.get(self.id)
            if registered is not None and registered.tuning is self.tuning:
                return registered if self.arch is None else get(self.id, self.arch)
            base = dataclasses.replace(self, defines=(), arch=None, **self.tuning.geometry(self.tuning.defaults))
            return base.for_arch(self.arch)
        geometry = self.tuning.geometry(full)
        return dataclasses.replace(self, defines=tuple(sorted(full.items())), **geometry)

    def for_arch(self, arch: str | None) -> "KernelSpec":
        """This kernel with the tiles the chapter takes on `arch` (sm_XY; None: the source's own):
        defines for the compiler and the launch geometry of the same values, so the two never part.
        A configuration chapter 8 chose stays as it is; a kernel whose tiles are the same on every
        GPU returns itself."""
        if not self.tiles_follow_arch or arch == self.arch:
            return self
        if self.defines and dict(self.defines) != self.tuning.defaults_on(self.arch):  # a chosen configuration
            return dataclasses.replace(self, arch=arch)
        config = self.tuning.defaults_on(arch)
        if config == self.tuning.defaults:
            registered = KERNELS.get(self.id)
            if registered is not None and registered.tuning is self.tuning:
                return registered
            return dataclasses.replace(self, arch=None, defines=(), **self.tuning.geometry(config))
        return dataclasses.replace(self, arch=arch, defines=tuple(sorted(config.items())),
                                   **self.tuning.geometry(config))

    def config_problems(self, D: int, arch: str | None = None) -> list[str]:
        """Why this build cannot run head dim D on `arch`, before compiling it: the kernel's
        compile-time rules, shared memory over the limit per block of the target (`arch`, else the
        build's own, else the GPU at hand's; the L4's 99 KB without one), and shared memory that lets
        fewer CTAs share an SM than the `min_ctas` knob promises. Empty when it can. Name `arch`
        where the target is not the GPU at hand: a build whose tiles are the source's own carries no
        architecture of its own."""
        if self.alternatives:  # whichever the launcher chooses must be able to run
            return list(dict.fromkeys(p for alt in self.alternative_specs() for p in alt.config_problems(D, arch)))
        if self.tuning is None:
            return []
        from ..gpus import SM_LIMITS, arch_at_hand, occupancy

        arch = arch or self.arch
        problems = list(self.tuning.rules(self.config, D))
        shape = Shape(1, 1, 1, D)
        smem = self.dynamic_smem(shape)
        limit, whose = max_smem_per_block(arch)
        if smem > limit:
            problems.append(f"{smem} B of shared memory at D={D}, over {whose} {limit} B per block")
        arch = arch or arch_at_hand()[0]
        if self.tuning.min_ctas is not None and arch in SM_LIMITS and smem <= SM_LIMITS[arch].smem_per_block:
            promised = self.config[self.tuning.min_ctas]
            fit = occupancy(arch, math.prod(self.block(shape)), 0, smem)
            if fit.blocks_per_sm < promised:
                problems.append(f"{smem} B of shared memory at D={D} lets {fit.blocks_per_sm} CTA(s) share an "
                                f"{arch} SM, fewer than the {promised} that {self.tuning.min_ctas}={promised} "
                                f"budgets registers for")
        return problems

    def config_label(self) -> str:
        """The configuration in a few words ("default" for the chapter's own)."""
        if not self.defines:
            return "default"
        base = self.tuning.defaults_on(self.arch)
        return ", ".join(f"{n}={v}" for n, v in self.defines if v != base[n]) or "default"

    def runs(self, shape: Shape, sms: int | None = None) -> "KernelSpec":
        """The kernel whose launch runs `shape` (on the GPU at hand, or one of `sms` SMs): this one,
        or for a kernel with `alternatives` the one its choice takes, built as this one is (the
        same architecture's tiles and the same configuration)."""
        if not self.alternatives:
            return self
        return self._alternative(self.alternatives[self.choice(shape, sms)])

    def _alternative(self, kernel_id: str) -> "KernelSpec":
        other = get(kernel_id, self.arch) if self.arch is not None else KERNELS[kernel_id]
        return other if other.defines == self.defines else other.with_config(dict(self.defines))

    def alternative_specs(self) -> list["KernelSpec"]:
        """Every kernel whose launch may run a shape of this one, built as this one is (itself alone
        without `alternatives`)."""
        return [self._alternative(k) for k in self.alternatives] or [self]

    def entry_for(self, D: int) -> str:
        """The extern "C" entry point that runs head dim D (without a key split)."""
        return self.entries_by_head_dim[D] if self.entries_by_head_dim is not None else self.entry

    def entry_at(self, shape: Shape, split: int | None = None) -> str:
        """The entry the launcher runs at `shape`: entry_for(D), or the entry of the key split it
        takes there on the GPU at hand (or of `split`)."""
        if self.alternatives:
            return self.launch_config(shape, split=split)["entry"]
        split = self.kv_split(shape) if split is None else split
        if self.entries_by_split is not None and split != 1:
            return self.entries_by_split[split][shape.D]
        return self.entry_for(shape.D)

    def entries_at_head_dim(self, D: int) -> list[str]:
        """Every entry that may run head dim D, one per key split (several splits may share one), of
        every alternative."""
        if self.alternatives:
            return list(dict.fromkeys(e for alt in self.alternative_specs() for e in alt.entries_at_head_dim(D)))
        extra = [by_d[D] for by_d in (self.entries_by_split or {}).values() if D in by_d]
        return list(dict.fromkeys([self.entry_for(D)] + extra))

    def supports_head_dim(self, D: int) -> bool:
        if self.head_dims is not None:
            return D in self.head_dims
        return 1 <= D <= self.max_head_dim

    def head_dim_text(self) -> str:
        if self.head_dims is not None:
            dims = sorted(self.head_dims)
            steps = {b - a for a, b in zip(dims, dims[1:])}
            if len(dims) > 3 and len(steps) == 1:  # e.g. every multiple of 8 up to 128
                return f"{dims[0]}..{dims[-1]} step {steps.pop()}"
            return ", ".join(str(d) for d in dims)
        return f"1..{self.max_head_dim}"

    def launch_config(self, shape: Shape, sms: int | None = None, split: int | None = None) -> dict:
        """What the launcher runs at `shape`: grid, block, dynamic shared memory, the entry and the
        key split (1 for kernels without one), on the GPU at hand or on one of `sms` SMs, or with
        the key split `split` when it is given. Bench records keep it with each time;
        attnlab.records.fingerprint hashes it."""
        if self.alternatives:  # the SM count once, for the choice and the chosen kernel's split
            if sms is None:
                from ..gpus import sm_count
                sms = sm_count()[0]
            # the chosen kernel's launch, with this one's key split (a launcher step may choose it its own way)
            return self.runs(shape, sms).launch_config(shape, sms, self.kv_split(shape, sms) if split is None else split)
        split = self.kv_split(shape, sms) if split is None else split
        at = (self.at_split(shape, split) if self.at_split is not None
              else {"grid": self.grid(shape), "dynamic_smem": self.dynamic_smem(shape)})
        return {"grid": at["grid"], "block": self.block(shape), "dynamic_smem": at["dynamic_smem"],
                "entry": self.entry_at(shape, split), "kv_split": split}


KERNELS: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> KernelSpec:
    if spec.id in KERNELS:
        raise ValueError(f"kernel id {spec.id!r} registered twice")
    KERNELS[spec.id] = spec
    return spec


# (kernel id, arch) -> the registered kernel built for that architecture: made once each.
_BY_ARCH: dict[tuple[str, str], KernelSpec] = {}


def get(kernel_id: str, arch: str | None = None) -> KernelSpec:
    """The kernel built for `arch` (sm_XY), by default the GPU at hand's (the L4's sm_89 without
    one): its tiles, its defines and its launch geometry (KernelSpec.for_arch)."""
    try:
        spec = KERNELS[kernel_id]
    except KeyError:
        known = ", ".join(KERNELS)
        raise KeyError(f"unknown kernel {kernel_id!r}; registered: {known}") from None
    if not spec.tiles_follow_arch:
        return spec
    if arch is None:
        from ..gpus import arch_at_hand
        arch = arch_at_hand()[0]
    key = (kernel_id, arch)
    if key not in _BY_ARCH:
        _BY_ARCH[key] = spec.for_arch(arch)
    return _BY_ARCH[key]


def by_label(label: str) -> KernelSpec:
    """A kernel named as "<id>" (built for the GPU at hand) or "<id>@sm_XY" (built with the tiles it
    takes on that architecture): how the CPU suite and its mutants name the other tiles they run."""
    kernel_id, _, arch = label.partition("@")
    return get(kernel_id, arch or None)


def select(ids: list[str] | None, arch: str | None = None) -> list[KernelSpec]:
    """The kernels named on a command line, or all of them in chapter order, built for `arch` (the
    GPU at hand's by default)."""
    if not ids:
        ids = [s.id for s in sorted(KERNELS.values(), key=lambda s: (s.chapter, s.id))]
    return [get(i, arch) for i in ids]
