"""A registered kernel's launch on the CPU executor, instrumented: what its threads did, counted
over every CTA, and every event of one chosen CTA.

    t = trace("07_mma", MISSION)               # counts of every CTA, the events of CTA 0
    t.totals()["global_read"], t.sites(), t.events
    print(format_trace(t))                     # what `python -m attnlab trace 07_mma` prints

Everything here is a measurement of execution (bytes, requests, wavefronts, sectors, instructions,
exponentials, barriers), exact and the same on every run. None of it is a time: the executor runs
threads one after another on a CPU core.

A trace is cached on disk (attnlab's cache, under counts/), keyed by the kernel's library (its
source, configuration, the executor's runtime and the compiler), the shape, the mask and the CTA:
a page that shows a chapter's counts after another page made them reads them back.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import numpy as np

from ..kernels import registry
from ..kernels.registry import KernelSpec
from ..shapes import MISSION, Shape
from .counts import BLOCK_FIELDS, EVENT_DTYPE, UNIT_OF, LaunchCounts, SiteCount
from .trips import EntryBlocks

CACHE_VERSION = 8
MMA_FLOPS = 2 * 16 * 8 * 16  # one mma.sync.m16n8k16: the unit tensor-core work is counted in

# The counts a trace totals, in the order they are shown: key, what it counts, unit.
COUNTS: tuple[tuple[str, str, str], ...] = (
    ("global_read", "global memory read (all loads, as CTAs ask L2)", "bytes"),
    ("global_distinct_read", "distinct global bytes read (the least DRAM must deliver)", "bytes"),
    ("global_write", "global memory written", "bytes"),
    ("global_requests", "global load and store instructions (warp-wide)", "requests"),
    ("global_sectors", "32-byte sectors those requests touch", "sectors"),
    ("global_excess_sectors", "sectors past the fewest that hold the bytes asked for", "sectors"),
    ("shared_requests", "shared-memory requests (warp-wide, ldmatrix and cp.async included)", "requests"),
    ("shared_wavefronts", "shared-memory wavefronts", "wavefronts"),
    ("shared_excess_wavefronts", "wavefronts past the conflict-free ideal (bank conflicts)", "wavefronts"),
    ("tensor_instructions", "tensor-core work, in mma.sync.m16n8k16 instructions", "instructions"),
    ("exps", "exponentials (per thread)", "exp"),
    ("barriers", "block barriers (warp-wide bar.sync and bar.arrive)", "barriers"),
    ("shuffles", "warp shuffles (warp-wide)", "shuffles"),
    ("cp_async_bytes", "bytes copied by cp.async", "bytes"),
)


@dataclass
class Trace:
    """One instrumented run of a kernel: the counts of each launch it made (chapter 4 makes one on
    the executor, the split across CTAs two) and the events of CTA `cta` of each."""
    kernel: str                             # its label: "<id>", or "<id>@sm_XY" where tiles follow the target
    shape: Shape
    causal: bool
    cta: int | None
    launches: list[LaunchCounts]
    completed: bool = True
    findings: list[str] = field(default_factory=list)
    heads_run: int | None = None            # None: every CTA ran; else trace_one_head ran this many heads' CTAs

    def totals(self) -> dict[str, int]:
        """Every count of COUNTS, summed over the launches and their CTAs."""
        out = {name: sum(launch.total(name) for launch in self.launches) for name in BLOCK_FIELDS}
        sites = self.sites()
        glob = [s for s in sites if s.kind in ("global load", "global store")]
        out["global_distinct_read"] = sum(r for launch in self.launches for r, _ in launch.distinct)
        out["global_distinct_write"] = sum(w for launch in self.launches for _, w in launch.distinct)
        out["global_requests"] = sum(s.requests for s in glob)
        out["global_sectors"] = sum(s.units for s in glob)
        out["global_excess_sectors"] = sum(s.excess for s in glob)
        out["shared_excess_wavefronts"] = out["shared_wavefronts"] - out["shared_ideal"]
        out["tensor_instructions"] = out["tensor_flops"] // MMA_FLOPS
        return out

    def sites(self) -> list[SiteCount]:
        """Per source line and kind, summed over the launches' instruction sites (one line may hold
        several instructions of a kind), in the order the kernel first ran them."""
        merged: dict[tuple[str, str], list[int]] = {}
        for launch in self.launches:
            for s in launch.sites:
                row = merged.setdefault((s.where, s.kind), [0, 0, 0, 0, 0])
                for i, v in enumerate((s.lanes, s.requests, s.bytes, s.units, s.ideal)):
                    row[i] += v
        return [SiteCount(where, kind, *row) for (where, kind), row in merged.items()]

    def per_cta(self, name: str, launch: int = 0) -> np.ndarray:
        """One count of BLOCK_FIELDS per CTA of a launch, CTAs in linear order (x fastest)."""
        return self.launches[launch].block_field(name)

    @property
    def events(self) -> np.ndarray:
        """The traced CTA's events in the first launch (EVENT_DTYPE)."""
        return self.launches[0].events if self.launches else np.zeros(0, EVENT_DTYPE)


def ideal_counts(shape: Shape, causal: bool) -> dict[str, int]:
    """What any exact attention kernel must do at `shape`: read Q, K and V and write O once (fp16),
    one exponential per score it keeps, 4 D FLOPs per score (two matmuls), all of them in
    m16n8k16 tensor-core instructions where a kernel uses tensor cores, no bank conflict and no
    wasted sector. Causal keeps the L (L + 1) / 2 scores on and under the diagonal."""
    B, H, L, D = shape
    scores = B * H * (L * (L + 1) // 2 if causal else L * L)
    io = B * H * L * D * 2
    return {"global_read": 3 * io, "global_distinct_read": 3 * io, "global_write": io, "global_excess_sectors": 0,
            "shared_excess_wavefronts": 0, "exps": scores, "tensor_instructions": -(-4 * D * scores // MMA_FLOPS)}


def _launch_args(spec: KernelSpec, shape: Shape, causal: bool, cta: int | None, seed: int, sms: int | None) -> str:
    from .cpu import library_for

    lib = library_for(spec)
    return json.dumps([CACHE_VERSION, lib.path.name, spec.id, list(shape), bool(causal), cta, seed,
                       spec.launch_config(shape, sms)])


def _cache_file(key: str):
    from ..paths import cache_dir

    folder = cache_dir() / "counts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".npz")


def _save(path, t: Trace) -> None:
    meta = {"kernel": t.kernel, "shape": list(t.shape), "causal": t.causal, "cta": t.cta, "completed": t.completed,
            "findings": t.findings,
            "launches": [{"entry": c.entry, "grid": list(c.grid), "block": list(c.block), "sites": [list(s.__dict__.values()) for s in c.sites],
                          "distinct": c.distinct, "traced_block": c.traced_block, "truncated": c.truncated,
                          "buffers": c.buffers,
                          "trip_blocks": None if c.trip_blocks is None else asdict(c.trip_blocks)} for c in t.launches]}
    arrays = {f"blocks{i}": c.blocks for i, c in enumerate(t.launches)}
    arrays.update({f"events{i}": c.events for i, c in enumerate(t.launches)})
    arrays.update({f"trips{i}": c.trip_runs for i, c in enumerate(t.launches) if c.trip_runs is not None})
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)
    tmp.replace(path)


def _load(path) -> Trace | None:
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            launches = [LaunchCounts(m["entry"], tuple(m["grid"]), tuple(m["block"]), [SiteCount(*s) for s in m["sites"]],
                                     data[f"blocks{i}"], [tuple(d) for d in m["distinct"]], data[f"events{i}"],
                                     m["traced_block"], m["truncated"], m["buffers"],
                                     trip_runs=data[f"trips{i}"] if f"trips{i}" in data else None,
                                     trip_blocks=_entry_blocks(m.get("trip_blocks")))
                        for i, m in enumerate(meta["launches"])]
    except (OSError, KeyError, ValueError):
        return None
    return Trace(meta["kernel"], Shape(*meta["shape"]), meta["causal"], meta["cta"], launches, meta["completed"],
                 meta["findings"])


def _entry_blocks(saved: dict | None) -> EntryBlocks | None:
    """An EntryBlocks from its JSON form (lists where it has tuples)."""
    if saved is None:
        return None
    def tuples(x):
        return tuple(tuples(y) for y in x) if isinstance(x, list) else x

    return EntryBlocks(**{k: tuples(v) for k, v in saved.items()})


# A count run's limit on the executor. Every CTA of a 1,024-CTA launch at (2, 16, 4096, 128) takes
# about 15 minutes on one core; a run past the limit stops with part of the counts (not completed,
# never cached, and refused by the model: model.bounds.counted).
COUNT_TIME_LIMIT_S = 3600.0


def _share(blocks: tuple[int, int, int]):
    """One process's share of a counted launch: the blocks lo, lo + step, ... below hi of the grid (a
    child forked by _run_sharded, which left it the kernel and its inputs in _SHARED_RUN)."""
    import torch

    from .cpu import attention_cpu

    torch.set_num_threads(1)  # a forked child: no thread pool of its own
    spec, label, shape, causal, cta, seed, sms, q, k, v = _SHARED_RUN
    lo, hi, step = blocks
    mine = cta is not None and lo <= cta < hi and (cta - lo) % step == 0
    _, report = attention_cpu(spec, q, k, v, causal, seed=seed, races=False, banks=True, count=True,
                              trace_block=cta if mine else None, time_limit=COUNT_TIME_LIMIT_S, sms=sms,
                              block_range=(lo, hi, step))
    return report.completed, [f.line(label) for f in report.findings], report.counts[0]


_SHARED_RUN: tuple = ()  # what _run_sharded's forked children run (a KernelSpec does not pickle)


def _merge_shares(shares: list[LaunchCounts]) -> LaunchCounts:
    """The counts of a whole grid from launches that each ran a share of it, in block order: the
    per-block and per-site counts add up (the sites in the order the blocks first ran them, as one
    launch lists them), the distinct bytes are the union of what each share touched, and the
    events are the traced block's share's, their sites renumbered to match."""
    traced = next((c for c in shares if c.traced_block is not None), shares[0])
    index: dict[tuple[int, str], int] = {}
    sites: list[list] = []
    events = traced.events.copy()
    for c in shares:
        renumber = np.empty(len(c.sites), np.int64)
        for i, (pc, s) in enumerate(zip(c.site_pcs, c.sites)):
            if (pc, s.kind) not in index:
                index[(pc, s.kind)] = len(sites)
                sites.append([s.where, s.kind, 0, 0, 0, 0, 0])
            row = sites[index[(pc, s.kind)]]
            renumber[i] = index[(pc, s.kind)]
            for j, x in enumerate((s.lanes, s.requests, s.bytes, s.units, s.ideal)):
                row[2 + j] += x
        if c is traced and len(events):
            has_site = events["site"] != np.iinfo(np.uint32).max
            events["site"][has_site] = renumber[events["site"][has_site]]
    distinct = []
    for b in range(len(traced.distinct)):
        flags = [c.touched[b] for c in shares]
        union = np.zeros(max(len(f) for f in flags), np.uint8)
        for f in flags:
            union[: len(f)] |= f
        distinct.append((int((union & 1).sum()), int((union >> 1 & 1).sum())))
    return LaunchCounts(traced.entry, traced.grid, traced.block, [SiteCount(*r) for r in sites],
                        sum(c.blocks for c in shares), distinct, events, traced.traced_block,
                        traced.truncated, traced.buffers, [pc for pc, _ in index],
                        trip_runs=None if traced.trip_runs is None else sum(c.trip_runs for c in shares),
                        trip_blocks=traced.trip_blocks)


def _run_sharded(spec: KernelSpec, label: str, shape: Shape, causal: bool, cta: int | None, seed: int,
                 sms: int | None, q, k, v, jobs: int, n: int, step: int = 1):
    """(completed, findings, LaunchCounts) of a one-launch kernel's counted run, its grid of `n`
    blocks (or the n blocks 0, step, 2 step, ... of it) split among `jobs` forked processes: every
    block runs exactly once and counts the same wherever it runs, so the merge is the counts of those
    blocks."""
    import multiprocessing
    import warnings

    global _SHARED_RUN
    bounds = np.linspace(0, n, jobs + 1).round().astype(int)
    requests = [(int(a) * step, int(b) * step, step) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    _SHARED_RUN = (spec, label, shape, causal, cta, seed, sms, q, k, v)
    try:
        with warnings.catch_warnings():  # fork in a threaded process (a notebook's kernel): the children only count
            warnings.simplefilter("ignore", DeprecationWarning)
            with multiprocessing.get_context("fork").Pool(len(requests)) as pool:
                results = pool.map(_share, requests)
    finally:
        _SHARED_RUN = ()
    return (all(r[0] for r in results), sorted({line for r in results for line in r[1]}),
            _merge_shares([r[2] for r in results]))


def trace_jobs() -> int:
    """Processes a count run splits its grid among: ATTNLAB_TRACE_JOBS, else every core (one where
    fork is not how processes start, or inside a worker of warm())."""
    import multiprocessing
    import os

    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.parent_process() is not None:
        return 1
    return max(1, int(os.environ.get("ATTNLAB_TRACE_JOBS", os.cpu_count() or 1)))


def _checked(kernel: str | KernelSpec, shape: Shape, causal: bool, arch: str | None) -> tuple[KernelSpec, Shape]:
    """The kernel's build for `arch` and the shape, or AttentionInputError for a shape it cannot take."""
    from ..kernels.contract import AttentionInputError, shape_problem

    spec = registry.get(kernel, arch) if isinstance(kernel, str) else kernel
    shape = Shape(*shape)
    problem = shape_problem(spec, shape, causal)
    if problem:
        raise AttentionInputError(f"{spec.id}: {problem}")
    return spec, shape


def _cached(kind: str, spec: KernelSpec, shape: Shape, causal: bool, cta: int | None, seed: int,
            sms: int | None, cache: bool):
    """(the cache file of this count run, None without a cache; the trace it holds, else None)."""
    path = _cache_file(kind + _launch_args(spec, shape, causal, cta, seed, sms)) if cache else None
    found = _load(path) if path is not None and path.exists() else None
    return path, found


def trace(kernel: str | KernelSpec, shape: Shape = MISSION, causal: bool = False, cta: int | None = 0, *,
          arch: str | None = None, sms: int | None = None, seed: int = 0, cache: bool = True,
          jobs: int | None = None) -> Trace:
    """Run `kernel` at `shape` on the CPU executor with its counts on, recording every event of CTA
    `cta` (its linear index, x fastest; None: counts only). `arch` picks the tiles of a target
    where the kernel's follow it (default: the GPU at hand's, the L4's sm_89 without one), `sms` the
    SM count the launcher sizes its grid for (chapter 7's key split; default: the GPU at hand's). The race
    check is off (a count run is not a check; `check --cpu` is); the executor's findings still come
    back in `findings`. A one-launch kernel's grid is split among `jobs` processes (default
    trace_jobs(): every core), which changes nothing in the counts. Raises AttentionInputError for a
    shape the kernel cannot take."""
    from ..pass_rule import make_inputs
    from .cpu import attention_cpu, cpu_label

    spec, shape = _checked(kernel, shape, causal, arch)
    path, found = _cached("", spec, shape, causal, cta, seed, sms, cache)
    if found is not None:
        return found
    q, k, v = make_inputs(shape, seed, device="cpu")
    label = cpu_label(spec, arch)
    blocks = int(np.prod(spec.launch_config(shape, sms)["grid"]))
    jobs = min(jobs or trace_jobs(), blocks)
    if jobs > 1 and spec.runner is None:
        completed, findings, counts = _run_sharded(spec, label, shape, causal, cta, seed, sms, q, k, v, jobs, blocks)
        result = Trace(label, shape, bool(causal), cta, [counts], completed, findings)
    else:
        _, report = attention_cpu(spec, q, k, v, causal, seed=seed, races=False, banks=True, count=True,
                                  trace_block=cta, time_limit=COUNT_TIME_LIMIT_S, sms=sms)
        result = Trace(label, shape, bool(causal), cta, report.counts, report.completed,
                       [f.line(label) for f in report.findings])
    if path is not None and result.completed:
        _save(path, result)
    return result


def one_head_grid(spec: KernelSpec, shape: Shape, sms: int | None = None, causal: bool = False) -> tuple[int, int] | None:
    """(CTAs of one head, the stride between them in linear order) where the launch at `shape` puts
    the (batch, head) pairs on grid y, one launch and no grid z: the x CTAs of pair h are blocks
    [h x, (h + 1) x), stride 1; or, for a kernel whose causal grid interleaves the pairs
    (causal_heads_first), blocks h, h + B H, h + 2 B H, ..., stride B H. Else None."""
    gx, gy, gz = spec.launch_config(shape, sms)["grid"]
    spec = spec.runs(shape, sms)  # the kernel the launch runs: its runner and its causal order
    if spec.runner is not None:
        return None
    if (gy, gz) != (shape.B * shape.H, 1):
        return None
    return (gx, gy) if causal and spec.causal_heads_first else (gx, 1)


def trace_one_head(kernel: str | KernelSpec, shape: Shape, causal: bool = False, *, arch: str | None = None,
                   sms: int | None = None, seed: int = 0, cache: bool = True, jobs: int | None = None) -> Trace:
    """The counts of the whole launch at `shape` with only the CTAs of its first head run, the rest
    taken to be theirs: every head's CTAs run the same code on the same tile geometry, so each CTA of
    head h counts what the same CTA of head 0 counted (per CTA, per site, and distinct bytes per head).
    For the large shapes, whose every CTA would take the executor hours; `heads_run` says it is so.
    The launch is the launcher's at the full shape (its grid and key split), so the counts are those
    of that launch, not of a one-head shape's. Raises ValueError for a launch whose heads are not
    grid y alone (one_head_grid)."""
    from ..pass_rule import make_inputs
    from .cpu import cpu_label

    spec, shape = _checked(kernel, shape, causal, arch)
    grid = one_head_grid(spec, shape, sms, causal)
    if grid is None:
        raise ValueError(f"{spec.id} at {shape.label()}: its launch does not put the heads on grid y alone")
    gx, step = grid
    path, found = _cached("one head ", spec, shape, causal, 0, seed, sms, cache)
    if found is not None:
        found.heads_run = 1
        return found
    q, k, v = make_inputs(shape, seed, device="cpu")
    label = cpu_label(spec, arch)
    completed, findings, head = _run_sharded(spec, label, shape, causal, 0, seed, sms, q, k, v,
                                             min(jobs or trace_jobs(), gx), gx, step)
    heads = shape.B * shape.H
    ran = head.blocks[0: gx * step: step]  # the first pair's CTAs, in launch order
    def every_head(per_block):
        return np.tile(per_block, (heads, 1)) if step == 1 else np.repeat(per_block, heads, axis=0)

    blocks = every_head(ran)
    trips = None if head.trip_runs is None else every_head(head.trip_runs[0: gx * step: step])
    counts = LaunchCounts(head.entry, head.grid, head.block,
                          [SiteCount(s.where, s.kind, *(heads * x for x in (s.lanes, s.requests, s.bytes, s.units, s.ideal)))
                           for s in head.sites],
                          blocks, [(heads * r, heads * w) for r, w in head.distinct],
                          head.events, head.traced_block, head.truncated, head.buffers,
                          trip_runs=trips, trip_blocks=head.trip_blocks)
    result = Trace(label, shape, bool(causal), 0, [counts], completed, findings, heads_run=1)
    if path is not None and result.completed:
        _save(path, result)
    return result


def short_places(wheres) -> dict[str, str]:
    """Each site's place ("a.cuh:3 < k.cu:10 < k.cu:96 < k.cu:120", innermost first) without the
    frames every site shares (the entry point's own chain) and with a repeated file written once:
    "a.cuh:3 < k.cu:10"."""
    frames = {w: w.split(" < ") for w in wheres}
    common = 0
    lists = [f for f in frames.values() if f]
    while lists and all(len(f) > common + 1 for f in lists) and len({f[-1 - common] for f in lists}) == 1:
        common += 1
    out = {}
    for w, f in frames.items():
        kept = f[: len(f) - common] if common else f
        text, last_file = [], None
        for frame in kept:
            file, _, line = frame.rpartition(":")
            text.append(f":{line}" if file == last_file else frame)
            last_file = file
        out[w] = " < ".join(text)
    return out


def _fmt(n: int) -> str:
    return f"{n:,}"


def format_trace(t: Trace, sites: bool = True) -> str:
    """The totals next to the ideal, then (with `sites`) one line per source line and kind."""
    totals, ideal = t.totals(), ideal_counts(t.shape, t.causal)
    head = [f"{t.kernel} at {t.shape.label()}{', causal' if t.causal else ''} on the CPU executor: counts of "
            "execution, not times"]
    for c in t.launches:
        ctas = int(np.prod(c.grid))
        traced = f"; CTA {c.traced_block} traced ({len(c.events):,} events{', truncated' if c.truncated else ''})" \
            if c.traced_block is not None else ""
        head.append(f"  launch {c.entry}: grid {c.grid} = {ctas} CTAs of {int(np.prod(c.block))} threads{traced}")
    if not t.completed:
        head.append("  the launch did not complete: these counts cover only what ran")
    head += [f"  finding: {f}" for f in t.findings]
    width = max(len(text) for _, text, _ in COUNTS)
    lines = head + ["", f"  {'count':<{width}} {'measured':>15} {'ideal':>15}"]
    for key, text, unit in COUNTS:
        ref = ideal.get(key)
        lines.append(f"  {text:<{width}} {_fmt(totals[key]):>15} {(_fmt(ref) if ref is not None else ''):>15}  {unit}")
    if sites:
        rows = t.sites()
        places = short_places([s.where for s in rows])
        where_w = min(60, max([len(p) for p in places.values()] + [5]))
        lines += ["", f"  {'site':<{where_w}} {'kind':<15} {'lanes':>12} {'requests':>11} {'bytes':>13} "
                      f"{'units':>11} {'ideal':>11}"]
        for s in rows:
            where = places[s.where]
            where = where if len(where) <= where_w else where[: where_w - 1] + "…"
            unit = {"wavefronts": "wf", "sectors": "sec"}.get(UNIT_OF.get(s.kind, ""), "")
            lines.append(f"  {where:<{where_w}} {s.kind:<15} {_fmt(s.lanes):>12} {_fmt(s.requests):>11} "
                         f"{_fmt(s.bytes):>13} {(_fmt(s.units) + ' ' + unit) if unit else '':>11} "
                         f"{(_fmt(s.ideal) if unit else ''):>11}")
    return "\n".join(lines)


def to_json(t: Trace, events: bool = True) -> dict:
    """The whole record as plain data: totals, ideal, sites, per-CTA counts and (with `events`)
    every traced event."""
    return {
        "kernel": t.kernel, "shape": list(t.shape), "causal": t.causal, "cta": t.cta, "completed": t.completed,
        "findings": t.findings, "measured": "execution counts on the CPU executor (never times)",
        "totals": t.totals(), "ideal": ideal_counts(t.shape, t.causal),
        "sites": [s.__dict__ for s in t.sites()],
        "launches": [{
            "entry": c.entry, "grid": list(c.grid), "block": list(c.block), "buffers": c.buffers,
            "distinct_bytes": [{"read": r, "written": w} for r, w in c.distinct],
            "per_cta": {name: c.block_field(name).tolist() for name in BLOCK_FIELDS},
            "traced_cta": c.traced_block, "truncated": c.truncated,
            "site_table": [s.__dict__ for s in c.sites],
            **({"events": [{k: (v.item() if hasattr(v, "item") else v) for k, v in zip(EVENT_DTYPE.names, e)}
                           for e in c.events]} if events else {}),
        } for c in t.launches],
    }


def _warm_one(request: tuple) -> str:
    kernel, shape, causal, arch, sms = request
    try:
        t = trace(kernel, Shape(*shape), causal, arch=arch, sms=sms)
    except Exception as exc:  # reported, never raised: one kernel's trouble must not stop the rest
        return f"{kernel} {tuple(shape)} causal={causal} {arch or ''}: {type(exc).__name__}: {exc}"
    return "" if t.completed and not t.findings else f"{t.kernel}: did not complete or has findings"


def warm(requests, jobs: int | None = None) -> list[str]:
    """Trace each (kernel, shape, causal, arch, sms) into the cache, `jobs` processes at once (every
    core by default): a machine with many cores makes a book's counts in the time of the longest.
    Returns one line per request that failed."""
    import os
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    requests = list(dict.fromkeys(tuple(r) for r in requests))
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1, mp_context=get_context("spawn")) as pool:
        return [line for line in pool.map(_warm_one, requests) if line]
