"""What the CPU executor saw a chapter's kernel do, as the pages show it: its counts at the mission
shape next to the ideal and the previous chapter's kernel, and figures drawn from the trace of one
CTA (attnlab.executor.trace), never by hand.

Every number here is a count of execution (bytes, requests, wavefronts, instructions), measured by
running the kernel; none is a time. One style for every figure: the warps in the qualitative
palette WARP_COLORS, the lanes in a cyclic map, counts in a sequential one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..executor.counts import BLOCK_FIELDS, EVENT_KINDS, WARP_EVENT_LANE
from ..executor.trace import Trace, ideal_counts, short_places, trace
from ..shapes import MISSION, Shape
from .banks import BANKS, WORD_BYTES, WarpAccess, warp_access

FIGURE_WIDTH = 8.6   # inches: the page's column at the book's resolution
WARP_CMAP = "tab10"
LANE_CMAP = "twilight"
COUNT_CMAP = "viridis"

# The counts a page's table shows, in order: key of Trace.totals(), label.
PAGE_COUNTS: tuple[tuple[str, str], ...] = (
    ("global_read", "global bytes read (all CTAs)"),
    ("global_distinct_read", "distinct global bytes read"),
    ("global_write", "global bytes written"),
    ("global_excess_sectors", "wasted 32-byte sectors (uncoalesced)"),
    ("shared_requests", "shared-memory requests"),
    ("shared_excess_wavefronts", "extra wavefronts (bank conflicts)"),
    ("tensor_instructions", "tensor-core instructions (m16n8k16)"),
    ("exps", "exponentials"),
    ("barriers", "block barriers met (summed over warps)"),
    ("shuffles", "warp shuffles"),
    ("cp_async_bytes", "cp.async bytes"),
)


# Rows a table leaves out where every kernel in it counts zero.
OPTIONAL_COUNTS = ("tensor_instructions", "barriers", "shuffles", "cp_async_bytes")


def counts(kernel_ids: list[str], shape: Shape = MISSION, causal: bool = False) -> dict[str, Trace]:
    """Each kernel traced at `shape` (every CTA counted, CTA 0 traced; cached on disk). Raises
    ExecutorUnavailable without a C++ compiler."""
    return {kid: trace(kid, shape, causal) for kid in kernel_ids}


class _Missing(dict):
    """The traces of a page whose machine has no C++ compiler: every kernel maps to None, and the
    figures and glue of the section say nothing (the section's one notice said why)."""

    def __missing__(self, key):
        return None


def counts_rows(traces: dict[str, Trace], shape: Shape = MISSION, causal: bool = False) -> tuple[list[str], list[list]]:
    """The table of PAGE_COUNTS: one row a count, the ideal, then one column a kernel."""
    ideal = ideal_counts(shape, causal)
    header = ["count (measured on the CPU executor)", "ideal", *[f"`{k}`" for k in traces]]
    totals = {k: t.totals() for k, t in traces.items()}
    rows = []
    for key, label in PAGE_COUNTS:
        if key in OPTIONAL_COUNTS and not any(totals[k][key] for k in traces):
            continue  # (no kernel of the table uses tensor cores, say: the row would say nothing)
        ref = ideal.get(key)
        rows.append([label, f"{ref:,}" if ref is not None else "", *[f"{totals[k][key]:,}" for k in traces]])
    return header, rows


def counts_table(kernel_id: str, *others: str, shape: Shape = MISSION, causal: bool = False) -> dict[str, Trace]:
    """Show a page's table: its kernel's counts at `shape` next to the ideal and the kernels in
    `others` (the previous chapter's, an ablation), and return the traces."""
    from ..executor.build import ExecutorUnavailable
    from .page import md_table, notice

    try:
        traces = counts([kernel_id, *others], shape, causal)
    except ExecutorUnavailable as exc:
        notice(f"**Not counted here.** {exc}: the CPU executor needs it to run the kernel.")
        return _Missing()
    for kid, t in traces.items():
        assert t.completed and not t.findings, (kid, t.findings)
    print(f"Counted by running every CTA on the CPU executor at {shape.label()}"
          f"{', causal' if causal else ''}: measurements of execution, never times.")
    md_table(*counts_rows(traces, shape, causal))
    return traces


# --- the trace's accesses, one row per access ------------------------------------------------

@dataclass
class Accesses:
    """The traced CTA's accesses of one kind, expanded from the trace's runs: one entry per access."""
    warp: np.ndarray
    lane: np.ndarray
    site: np.ndarray
    seq: np.ndarray         # the event's order (a run's accesses share it)
    epoch: np.ndarray       # its warp's meetings so far (the executor groups requests between them)
    occurrence: np.ndarray  # its rank among its lane's accesses at its site in its epoch, in program order
    offset: np.ndarray
    bytes: np.ndarray
    write: np.ndarray
    arg: np.ndarray

    def __len__(self) -> int:
        return len(self.offset)

    def where(self, mask) -> "Accesses":
        return Accesses(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


def _group_starts(keys: np.ndarray) -> np.ndarray:
    """For rows sorted by `keys` (columns), where each group of equal keys starts (a bool mask)."""
    new = np.ones(keys.shape[1], bool)
    if keys.shape[1] > 1:
        new[1:] = np.any(keys[:, 1:] != keys[:, :-1], axis=0)
    return new


def _runs(t: Trace, buffer: int | None, kinds, launch: int, per_lane_site: int | None):
    """The trace's access runs of `kinds` to `buffer`, each with the occurrence of its first access
    (the accesses its lane made earlier at its site in its epoch) and how many of its accesses to
    keep (all, or up to `per_lane_site` per lane, site and epoch)."""
    ev = t.launches[launch].events
    sel = np.isin(ev["kind"], [EVENT_KINDS.index(k) for k in kinds])
    if buffer is not None:
        sel &= ev["buffer"] == buffer
    ev = ev[sel]
    n = ev["count"].astype(np.int64)
    order = np.lexsort((ev["seq"], ev["lane"], ev["epoch"], ev["warp"], ev["site"]))
    key = np.stack([ev["site"][order], ev["warp"][order], ev["epoch"][order], ev["lane"][order]]).astype(np.int64)
    starts = _group_starts(key)
    csum = np.cumsum(n[order]) - n[order]
    group_base = np.maximum.accumulate(np.where(starts, csum, 0))
    first = np.empty(len(ev), np.int64)
    first[order] = csum - group_base
    take = n if per_lane_site is None else np.clip(per_lane_site - first, 0, n)
    return ev, first, take


def _expand(ev, first, take, **extra) -> Accesses:
    """One entry per access of the runs `ev` (the first `take` of each); `extra`, per-run arrays
    to carry along under Accesses' field names (they replace those the events give)."""
    rep = np.repeat(np.arange(len(ev)), take)
    within = np.arange(int(take.sum())) - np.repeat(np.cumsum(take) - take, take)
    offset = ev["offset"].astype(np.int64)[rep] + within * ev["stride"].astype(np.int64)[rep]
    fields = {"warp": ev["warp"], "lane": ev["lane"], "site": ev["site"], "seq": ev["seq"], "epoch": ev["epoch"],
              "bytes": ev["bytes"], "arg": ev["arg"], **extra}
    return Accesses(*(fields[f][rep].astype(np.int64) for f in ("warp", "lane", "site", "seq", "epoch")),
                    first[rep] + within, offset, fields["bytes"][rep].astype(np.int64),
                    ev["write"][rep].astype(bool), fields["arg"][rep].astype(np.int64))


def accesses(t: Trace, buffer: int | None = None, kinds=("access",), launch: int = 0,
             per_lane_site: int | None = None) -> Accesses:
    """Every access of the traced CTA to `buffer` (its index in the launch's buffers; -1 shared
    memory; None: any) among the events of `kinds`, runs expanded; with `per_lane_site`, only each
    lane's first that many accesses at each site in each epoch (the k-th accesses of a warp's lanes
    at a site in one epoch are one request, so a cap keeps whole requests)."""
    return _expand(*_runs(t, buffer, kinds, launch, per_lane_site))


# --- banks -----------------------------------------------------------------------------------

@dataclass
class SiteBanks:
    """One shared-memory source line and kind of the traced CTA, from the trace's addresses: the
    distinct 4-byte words each bank served per wavefront phase in which it was busy, on average (1:
    conflict-free; k: a k-way conflict; 0: never used), and the wavefronts its requests took
    against the ideal (one per phase)."""
    where: str
    kind: str
    words_per_bank: np.ndarray   # [32]
    wavefronts: int
    ideal: int
    requests: int


def _distinct(codes: np.ndarray, starts: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of `codes`, sorted, with how often each occurs (or, `starts`, where each
    begins in the sorted codes): np.unique by one sort, several times quicker than the hashing
    numpy 2 uses for tens of millions of integers."""
    s = np.sort(codes)
    first = np.ones(len(s), bool)
    first[1:] = s[1:] != s[:-1]
    begin = np.flatnonzero(first)
    return s[first], begin if starts else np.diff(np.append(begin, len(s)))


def _collapsible(ev, first, take) -> tuple[np.ndarray, np.ndarray]:
    """Per run, (how many requests its first access may stand for, the banks its words move by
    from one of those requests to the next); 1 request: expand the run. When every run of a set of
    requests has the same stride, a multiple of 4 bytes, and covers the same occurrences, request k
    is request 0 with every word moved by k strides: the same conflicts, its banks rotated by
    k x stride / 4 modulo 32. Chapter 1's lanes each walk a column of their own, 64 rows 256 bytes
    apart (no rotation); chapter 2's walk a padded tile, 260 bytes apart (one bank per row)."""
    n = len(ev)
    weight, step = np.ones(n, np.int64), np.zeros(n, np.int64)
    if not n:
        return weight, step
    trio = np.stack([ev["site"], ev["warp"], ev["epoch"]]).astype(np.int64)
    order = np.lexsort((first, trio[2], trio[1], trio[0]))
    t3, f, tk = trio[:, order], first[order], take[order]
    stride = ev["stride"][order].astype(np.int64)
    same_trio = np.ones(n, bool)
    same_trio[1:] = np.all(t3[:, 1:] == t3[:, :-1], axis=0)
    same_trio[0] = False
    same_group = same_trio.copy()
    same_group[1:] &= f[1:] == f[:-1]
    group = np.cumsum(~same_group) - 1
    trio_id = np.cumsum(~same_trio) - 1
    bad_group = np.zeros(group[-1] + 1, bool)
    # a group's runs cover the same occurrences at one stride, a whole number of words
    bad_group[group[1:][same_group[1:] & ((tk[1:] != tk[:-1]) | (stride[1:] != stride[:-1]))]] = True
    bad_group[group[stride % WORD_BYTES != 0]] = True
    # groups of one instruction in one epoch do not overlap (a run split elsewhere in another lane)
    bad_trio = np.zeros(trio_id[-1] + 1, bool)
    starts = np.flatnonzero(~same_group)
    ends = f[starts] + tk[starts]
    overlap = same_trio[starts[1:]] & (f[starts[1:]] < ends[:-1])
    bad_trio[trio_id[starts[1:]][overlap]] = True
    ok = ~bad_group[group] & ~bad_trio[trio_id] & (tk > 1)
    weight[order[ok]] = tk[ok]
    step[order[ok]] = stride[ok] // WORD_BYTES % BANKS
    return weight, step


def _rotations(weight: int, step: int) -> np.ndarray:
    """How many of `weight` requests, k = 0, 1, ..., have their banks rotated by each of 0..31:
    k x step modulo 32."""
    return np.bincount(np.arange(weight) * step % BANKS, minlength=BANKS)


def shared_sites(t: Trace, launch: int = 0, per_lane_site: int | None = None) -> list[SiteBanks]:
    """Every shared-memory source line and kind of the traced CTA (loads, stores, ldmatrix, cp.async
    destinations; not WMMA's fragments, whose layout is the runtime's and not the GPU's), as
    SiteBanks, in the order the kernel first ran them; with `per_lane_site`, from each warp's first
    that many requests at each instruction in each epoch."""
    c = t.launches[launch]
    ev, first, take = _runs(t, -1, ("access", "ldmatrix", "cp.async"), launch, per_lane_site)
    kind_of_site = np.array([s.kind for s in c.sites] + ["none"])
    keep = ~np.isin(kind_of_site[np.minimum(ev["site"], len(c.sites))], ["wmma load", "wmma store"])
    ev, first, take = ev[keep], first[keep], take[keep]
    if not len(ev):
        return []
    site_kind = kind_of_site[ev["site"]]
    # the phase a lane's access is served in: ldmatrix by matrix (8 row addresses each), else by
    # the width of the access (16 bytes: quarter-warps, 8: half-warps, less: the whole warp)
    per_phase = np.where(ev["bytes"] >= 16, 8, np.where(ev["bytes"] == 8, 16, 32))
    phase = np.where(site_kind == "ldmatrix", ev["arg"] // 8, ev["lane"] // per_phase).astype(np.int64)
    # each source line's first access, for the order of the rows
    places: dict[tuple[str, str], int] = {}
    group = np.array([places.setdefault((s.where, s.kind), len(places)) for s in c.sites], np.int64)
    first_seq = np.full(len(places), np.iinfo(np.int64).max)
    np.minimum.at(first_seq, group[ev["site"]], ev["seq"].astype(np.int64))
    # lanes of one phase that run the same run (a broadcast: chapter 1's lanes all read one column)
    # give the same words: one of them stands for all before the runs are expanded
    runs = np.stack([ev["site"], ev["warp"], ev["epoch"], first, phase, ev["offset"].astype(np.int64),
                     ev["stride"], take, ev["bytes"]]).astype(np.int64)
    _, one = np.unique(runs, axis=1, return_index=True)
    ev, first, take, phase = ev[one], first[one], take[one], phase[one]
    weight, step = _collapsible(ev, first, take)  # requests each expanded access stands for
    expanded = np.where(weight > 1, 1, take)
    a = _expand(ev, first, expanded, arg=phase)
    weight, step = np.repeat(weight, expanded), np.repeat(step, expanded)
    phase = a.arg
    # one 64-bit code per (instruction, warp, epoch, request, phase) and then per word: a chapter-1
    # CTA touches millions of words, and one sort of integers is what makes that quick
    fields = (a.site, a.warp, a.epoch, a.occurrence, phase)
    radix = [int(f.max()) + 1 for f in fields]
    word_radix = int((a.offset + a.bytes).max()) // WORD_BYTES + 1
    assert np.prod([float(r) for r in radix]) * word_radix < 2.0 ** 62, "trace too large to pack"
    phase_code = np.zeros(len(a), np.int64)
    for f, r in zip(fields, radix):
        phase_code = phase_code * r + f
    words_per_access = (a.bytes + WORD_BYTES - 1) // WORD_BYTES
    rep = np.repeat(np.arange(len(a)), words_per_access)
    word = a.offset[rep] // WORD_BYTES + (np.arange(len(rep)) - np.repeat(np.cumsum(words_per_access) - words_per_access,
                                                                          words_per_access))
    words, _ = _distinct(phase_code[rep] * word_radix + word)   # distinct words per phase
    # words per (phase, bank); per phase, its wavefronts (the busiest bank)
    phase_bank, bank_words = _distinct(words // word_radix * BANKS + words % word_radix % BANKS)
    phases, phase_start = _distinct(phase_bank // BANKS, starts=True)
    wavefronts = np.maximum.reduceat(bank_words, phase_start)
    # each phase's weight (the requests it stands for), and each (phase, bank)'s
    known, at = np.unique(phase_code, return_index=True)
    phase_weight = weight[at][np.searchsorted(known, phases)]
    pb_of_phase = np.searchsorted(phases, phase_bank // BANKS)
    pb_weight, pb_step = phase_weight[pb_of_phase], step[at][np.searchsorted(known, phases)][pb_of_phase]
    request_of_phase = phases // radix[-1]
    site_of_phase = request_of_phase // (radix[1] * radix[2] * radix[3])
    site_of_pb = phase_bank // BANKS // int(np.prod(radix[1:]))
    bank_of_pb = phase_bank % BANKS
    words_at = np.zeros((len(places), BANKS))
    busy_at = np.zeros((len(places), BANKS))
    # a (phase, bank) that stands for several requests adds to its bank rotated as each of them
    for w, st in set(zip(pb_weight.tolist(), pb_step.tolist())):
        rows = (pb_weight == w) & (pb_step == st)
        for shift, times in enumerate(_rotations(w, st)):
            if times:
                banks_now = (bank_of_pb[rows] + shift) % BANKS
                np.add.at(words_at, (group[site_of_pb[rows]], banks_now), bank_words[rows] * times)
                np.add.at(busy_at, (group[site_of_pb[rows]], banks_now), times)
    wavefronts_at = np.bincount(group[site_of_phase], weights=wavefronts * phase_weight, minlength=len(places))
    ideal_at = np.bincount(group[site_of_phase], weights=phase_weight, minlength=len(places)).astype(np.int64)
    requests, first_phase = _distinct(request_of_phase, starts=True)
    requests_at = np.bincount(group[requests // (radix[1] * radix[2] * radix[3])], weights=phase_weight[first_phase],
                              minlength=len(places)).astype(np.int64)
    out = [(first_seq[g], SiteBanks(where, kind, np.divide(words_at[g], busy_at[g], out=np.zeros(BANKS),
                                                                where=busy_at[g] > 0),
                                    int(wavefronts_at[g]), int(ideal_at[g]), int(requests_at[g])))
           for (where, kind), g in places.items() if ideal_at[g]]
    return [sb for _, sb in sorted(out, key=lambda x: x[0])]


def warp_access_at(t: Trace, site_where: str, kind: str, warp: int = 0, occurrence: int = 0,
                   launch: int = 0) -> WarpAccess:
    """The traced CTA's `occurrence`-th request of `warp` at a shared-memory site (its place as in
    the counts, and kind; all its instructions), as attnlab.book.banks draws it: each lane's byte
    offset."""
    c = t.launches[launch]
    sites = [i for i, s in enumerate(c.sites) if s.where == site_where and s.kind == kind]
    a = accesses(t, -1, kinds=("access",), launch=launch)
    a = a.where(np.isin(a.site, sites) & (a.warp == warp))
    requests = np.unique(np.stack([a.epoch, a.occurrence]), axis=1)  # in program order
    epoch, occ = requests[:, occurrence]
    pick = a.where((a.epoch == epoch) & (a.occurrence == occ))
    order = np.argsort(pick.lane)
    assert len(order) == 32, f"{len(order)} lanes at that request"
    return warp_access(pick.offset[order], int(pick.bytes[0]))


def site_label(place: str) -> str:
    """A short place (short_places) as the line of the kernel that runs it: its outermost frame,
    "k.cu:10" for "a.cuh:3 < k.cu:7 < :10"."""
    frames = place.split(" < ")
    file = next((f.rpartition(":")[0] for f in reversed(frames) if not f.startswith(":")), "")
    last = frames[-1]
    return f"{file}{last}" if last.startswith(":") else last


def bank_heatmap(t: Trace, title: str | None = None, launch: int = 0, compare: Trace | None = None):
    """For each shared-memory source line of the traced CTA, the distinct 4-byte words each bank
    served per wavefront phase in which it was busy (1: conflict-free, k: a k-way conflict, blank:
    unused), with the line's wavefronts against the ideal; `compare`, a second trace (an
    ablation), drawn beside it on the same scale."""
    if t is None:
        return None
    import matplotlib.pyplot as plt

    traces = [t] + ([compare] if compare is not None else [])
    panels = [(x, shared_sites(x, launch)) for x in traces]
    rows = max([len(p) for _, p in panels] + [1])
    labels = []
    for _, sites in panels:
        places = short_places([s.where for s in sites])
        labels.append([f"{site_label(places[s.where])} {s.kind}" for s in sites])
    same_rows = len(panels) == 2 and labels[0] == labels[1]
    fig, axes = plt.subplots(1, len(panels), figsize=(FIGURE_WIDTH, 0.3 * rows + 1.6), squeeze=False)
    vmax = max([2.0] + [float(s.words_per_bank.max()) for _, p in panels for s in p])
    cmap = plt.get_cmap(COUNT_CMAP).with_extremes(bad="#f2f2f2")
    for i, (ax, (x, sites)) in enumerate(zip(axes[0], panels)):
        img = np.array([np.where(s.words_per_bank > 0, s.words_per_bank, np.nan) for s in sites]) if sites \
            else np.full((1, BANKS), np.nan)
        im = ax.imshow(img, aspect="auto", cmap=cmap, vmin=0, vmax=vmax, interpolation="nearest")
        ax.set_yticks(range(len(sites)))
        if i == 0 or not same_rows:
            ax.set_yticklabels(labels[i], fontsize=6.5)
        else:
            ax.set_yticklabels([])
        for row, site in enumerate(sites):
            ax.text(1.02, row, f"{site.wavefronts:,} / {site.ideal:,}", va="center", ha="left", fontsize=6.5,
                    transform=ax.get_yaxis_transform())
        ax.set_xticks(range(0, BANKS, 4))
        ax.set_xlabel("bank", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(f"{x.kernel}, CTA {x.cta}", fontsize=8)
    fig.subplots_adjust(left=0.26, right=0.8 if len(panels) == 1 else 0.84, wspace=0.45 if same_rows else 0.9,
                        top=1 - 0.75 / (0.3 * rows + 1.6), bottom=0.55 / (0.3 * rows + 1.6))
    cax = fig.add_axes([0.93, 0.2, 0.015, 0.6])
    cbar = fig.colorbar(im, cax=cax)
    cbar.set_label("words per busy bank and phase", fontsize=7)
    cbar.ax.tick_params(labelsize=7)
    fig.suptitle(title or "Shared-memory banks, from the trace's addresses (1 = conflict-free; "
                          "wavefronts / ideal at the right of each row)", fontsize=8.5)
    return fig


# --- who touches what ------------------------------------------------------------------------

def _row_bytes(t: Trace, name: str) -> int:
    return t.shape.L * 2 if name == "S" else t.shape.D * 2


def touched(t: Trace, name: str, write: bool, launch: int = 0):
    """(row, column, warp, lane) of every fp16 element of global buffer `name` the traced CTA read
    (or wrote), rows counted over the whole buffer (head h's rows start at h L)."""
    c = t.launches[launch]
    a = accesses(t, c.buffers.index(name), launch=launch)
    a = a.where(a.write == write)
    halves = a.bytes // 2
    rep = np.repeat(np.arange(len(a)), halves)
    element = a.offset[rep] // 2 + (np.arange(len(rep)) - np.repeat(np.cumsum(halves) - halves, halves))
    width = _row_bytes(t, name) // 2
    return element // width, element % width, a.warp[rep], a.lane[rep]


def _owner_image(rows, cols, values, width: int):
    r0, r1 = int(rows.min()), int(rows.max()) + 1
    img = np.full((r1 - r0, width), np.nan)
    img[rows - r0, cols] = values
    return img, r0, r1


def _walk(t: Trace, name: str, launch: int = 0):
    """(x, row, warp) points of the traced CTA's reads of `name`, and what x is: the step (block
    barriers passed) where the kernel has barriers, else the read's place among its lane's reads
    of `name`, in program order."""
    c = t.launches[launch]
    ev = c.events
    e = ev[(ev["kind"] == EVENT_KINDS.index("access")) & (ev["buffer"] == c.buffers.index(name)) & (ev["write"] == 0)]
    width = _row_bytes(t, name)
    first = e["offset"].astype(np.int64) // width
    last = (e["offset"].astype(np.int64) + e["stride"].astype(np.int64) * (e["count"].astype(np.int64) - 1)) // width
    stride = e["stride"].astype(np.int64)
    # a run along a row (or a few) covers every row between its ends; a run down a column, one row
    # in stride / width
    step_rows = np.where(np.abs(stride) < width, 1, np.maximum(np.abs(stride) // width, 1))
    n_rows = np.abs(last - first) // step_rows + 1
    rep = np.repeat(np.arange(len(e)), n_rows)
    k = np.arange(int(n_rows.sum())) - np.repeat(np.cumsum(n_rows) - n_rows, n_rows)
    rows = np.minimum(first, last)[rep] + k * step_rows[rep]
    if int(e["step"].max(initial=0)) > 0:
        x = e["step"].astype(np.int64)[rep]
        label = "step (block barriers passed)"
    else:  # where in its lane's stream of reads of the buffer each row comes, in KiB
        nbytes = e["bytes"].astype(np.int64) * e["count"].astype(np.int64)
        order = np.lexsort((e["seq"], e["lane"], e["warp"]))
        starts = _group_starts(np.stack([e["warp"][order], e["lane"][order]]).astype(np.int64))
        csum = np.cumsum(nbytes[order]) - nbytes[order]
        base = np.empty(len(e), np.int64)
        base[order] = csum - np.maximum.accumulate(np.where(starts, csum, 0))
        per_row = np.where(np.abs(stride) < width, width, e["bytes"].astype(np.int64))
        x = (base[rep] + k * per_row[rep]) // 1024
        label = "KiB of it the lane had read before (program order)"
    pts = np.unique(np.stack([x, rows, e["warp"].astype(np.int64)[rep]]), axis=1)
    return pts, label


def tiling_figure(t: Trace, title: str | None = None, launch: int = 0):
    """Who touches what in the traced CTA: which warp and which lane reads each element of its Q
    rows (or the rows of S), which warp writes each element of O, and the walk over K and V: the
    key rows each warp reads, step by step. Drawn from the trace's addresses."""
    if t is None:
        return None
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.ticker import MaxNLocator

    c = t.launches[launch]
    names = c.buffers
    rowwise = [n for n in ("Q", "S") if n in names]
    walks = [n for n in ("K", "V") if n in names]
    out = "O" if "O" in names else "S"
    warps = int(np.prod(c.block)) // 32 or 1
    warp_cmap = ListedColormap(plt.get_cmap(WARP_CMAP).colors[: max(warps, 1)] if warps <= 10
                               else plt.get_cmap("tab20").colors[:warps])
    ncols = 3
    nrows = 2 if walks else 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(FIGURE_WIDTH, 3.1 * nrows), squeeze=False)
    src = rowwise[0]
    rows, cols, warp, lane = touched(t, src, write=False, launch=launch)
    width = _row_bytes(t, src) // 2
    for ax, values, what, cmap, vmax in ((axes[0][0], warp, "warp", warp_cmap, warps - 0.5),
                                         (axes[0][1], lane, "lane", plt.get_cmap(LANE_CMAP), 31)):
        img, r0, r1 = _owner_image(rows, cols, values, width)
        im = ax.imshow(img, aspect="auto", cmap=cmap, vmin=-0.5 if what == "warp" else 0, vmax=vmax,
                       interpolation="nearest", extent=(-0.5, width - 0.5, r1 - 0.5, r0 - 0.5))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{src} read: which {what}", fontsize=8.5)
        ax.set_xlabel("column (element of the row)", fontsize=7.5)
        ax.set_ylabel(f"row of {src}", fontsize=7.5)
        ax.tick_params(labelsize=7)
        cb = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
        cb.ax.tick_params(labelsize=6.5)
        if what == "warp":
            cb.set_ticks(range(warps))
    rows, cols, warp, _ = touched(t, out, write=True, launch=launch)
    img, r0, r1 = _owner_image(rows, cols, warp, _row_bytes(t, out) // 2)
    ax = axes[0][2]
    im = ax.imshow(img, aspect="auto", cmap=warp_cmap, vmin=-0.5, vmax=warps - 0.5, interpolation="nearest",
                   extent=(-0.5, img.shape[1] - 0.5, r1 - 0.5, r0 - 0.5))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{out} written: which warp", fontsize=8.5)
    ax.set_xlabel("column", fontsize=7.5)
    ax.set_ylabel(f"row of {out}", fontsize=7.5)
    ax.tick_params(labelsize=7)
    for col, name in enumerate(walks):
        ax = axes[1][col]
        pts, label = _walk(t, name, launch)
        x = pts[0].astype(float)
        if label.startswith("step"):  # each warp in its own column of the step
            x = x + (pts[2] - (warps - 1) / 2) * 0.8 / max(warps, 1)
        ax.scatter(x, pts[1], c=pts[2], cmap=warp_cmap, vmin=-0.5, vmax=warps - 0.5, s=3, marker="s",
                   linewidths=0)
        ax.invert_yaxis()
        ax.set_title(f"{name} read, each warp's rows", fontsize=8.5)
        ax.set_xlabel(label, fontsize=7.5)
        ax.set_ylabel(f"row of {name}", fontsize=7.5)
        ax.tick_params(labelsize=7)
    if walks:
        ax = axes[1][2]
        ax.axis("off")
        per_cta = t.per_cta("global_read", launch)
        ax.text(0, 0.95, f"CTA {c.traced_block} of {len(per_cta):,} ({c.block[0]} threads, {warps} warps)\n"
                         f"global bytes it read: {int(per_cta[c.traced_block]):,}\n"
                         f"every CTA: {int(per_cta.sum()):,}\n"
                         f"distinct: {sum(r for r, _ in c.distinct):,}",
                va="top", fontsize=8, family="monospace")
    fig.suptitle(title or f"{t.kernel} at {t.shape.label()}{', causal' if t.causal else ''}: "
                 f"who touches what in CTA {c.traced_block} (from the executor's trace)", fontsize=9)
    fig.tight_layout()
    return fig


# --- global traffic per tensor (chapter 4) -----------------------------------------------------

def bytes_by_buffer(t: Trace, launch: int = 0) -> dict[str, dict[str, int]]:
    """Per global buffer of a launch: the distinct bytes read and written (the least DRAM moves) and
    every byte the CTAs asked for ("asked_read", "asked_write": L2's traffic), each site's bytes
    going to the buffer its accesses in the traced CTA fall in (a site the traced CTA never ran goes
    to "other")."""
    c = t.launches[launch]
    names = c.buffers or [f"buffer {i}" for i in range(len(c.distinct))]
    out = {n: {"distinct_read": r, "distinct_write": w, "asked_read": 0, "asked_write": 0}
           for n, (r, w) in zip(names, c.distinct)}
    ev = c.events[(c.events["kind"] == EVENT_KINDS.index("access")) & (c.events["buffer"] >= 0)]
    buffer_of_site = dict(zip(ev["site"].tolist(), ev["buffer"].tolist()))
    for i, site in enumerate(c.sites):
        if site.kind not in ("global load", "global store"):
            continue
        name = names[buffer_of_site[i]] if i in buffer_of_site else "other"
        row = out.setdefault(name, {"distinct_read": 0, "distinct_write": 0, "asked_read": 0, "asked_write": 0})
        row["asked_read" if site.kind == "global load" else "asked_write"] += site.bytes
    return out


TENSOR_COLORS = {"Q": 0, "K": 1, "V": 2, "O": 3, "S": 4, "P": 5, "other": 7}


def score_traffic_figure(fused: Trace, hybrid: Trace, lengths=(256, 512, 1024, 2048)):
    """Chapter 4's L x L traffic: the global bytes of the fused kernel (`fused`) and of the hybrid
    (`hybrid`, whose softmax is the only launch the executor ran: its GEMMs are added as the bytes
    of their operands, hatched and labelled computed), per tensor; left the distinct bytes (the least
    DRAM moves), middle every byte the CTAs asked for (L2's traffic); right, the hybrid softmax's
    distinct bytes traced at each of `lengths` (B = H = 1) against the fused kernel's ideal
    4 L D x 2 bytes, on log scales: L^2 against L."""
    if fused is None or hybrid is None:
        return None
    import matplotlib.pyplot as plt

    from ..model.bounds import gemm_operands

    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(1, 3, figsize=(FIGURE_WIDTH, 3.2), gridspec_kw={"width_ratios": [1, 1, 0.85]})
    mib = 1 / 2**20
    rows = [(f"{fused.kernel}\n(fused)", list(bytes_by_buffer(fused).items()), []),
            (f"{hybrid.kernel}\n(softmax + GEMMs)",
             [(n if n != "S" else "S, then P over it", v) for n, v in bytes_by_buffer(hybrid).items()],
             gemm_operands(hybrid.shape))]
    seen = set()
    for ax, kind, what in ((axes[0], "distinct", "distinct bytes (the least DRAM moves)"),
                           (axes[1], "asked", "bytes the CTAs asked L2 for")):
        for y, (label, measured, gemms) in enumerate(rows):
            left = 0.0

            def computed(step_prefix):
                nonlocal left
                for step, tensor, nbytes in gemms:
                    if not step.startswith(step_prefix):
                        continue
                    lbl = "GEMM operands (computed, not executed)" if "gemm" not in seen else None
                    seen.add("gemm")
                    ax.barh(y, nbytes * mib, left=left, color=colors[TENSOR_COLORS[tensor]], alpha=0.45,
                            hatch="///", edgecolor="black", lw=0.3, label=lbl)
                    left += nbytes * mib

            computed("GEMM S")  # in the order the hybrid runs: S = Q K^T, the softmax, O = P V
            for name, v in measured:
                for rw in ("read", "write"):
                    width = v[f"{kind}_{rw}"] * mib
                    if not width:
                        continue
                    tensor = name.split(",")[0]
                    lbl = (f"{name} (executed)" if tensor not in seen else None)
                    seen.add(tensor)
                    ax.barh(y, width, left=left, color=colors[TENSOR_COLORS.get(tensor, 7)], edgecolor="white",
                            lw=0.5, label=lbl)
                    left += width
            computed("GEMM O")
            ax.text(left, y, f" {left:,.1f}", va="center", fontsize=6.5)
        ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"MiB: {what}", fontsize=7)
        ax.tick_params(axis="x", labelsize=6.5)
        ax.margins(x=0.25)
    axes[1].set_yticklabels([])
    handles, labels = axes[0].get_legend_handles_labels()
    h1, l1 = axes[1].get_legend_handles_labels()
    fig.legend(handles + h1, labels + l1, fontsize=6.5, loc="lower center", ncol=4, frameon=False)
    ax = axes[2]
    measured = [trace(hybrid.kernel.split("@")[0], Shape(1, 1, L, hybrid.shape.D), hybrid.causal, cta=None).totals()
                for L in lengths]
    ax.loglog(lengths, [(m["global_distinct_read"] + m["global_distinct_write"]) * mib for m in measured], "o-",
              color=colors[4], label="hybrid softmax, S and P (executed)")
    ax.loglog(lengths, [4 * L * hybrid.shape.D * 2 * mib for L in lengths], "s--", color=colors[0],
              label="fused ideal, Q K V O (4 L D x 2)")
    ax.set_xticks(lengths, [str(L) for L in lengths])
    ax.minorticks_off()
    ax.set_xlabel(f"L (B = H = 1, D = {hybrid.shape.D})", fontsize=7)
    ax.set_ylabel("MiB, distinct", fontsize=7)
    ax.tick_params(labelsize=6.5)
    ax.set_ylim(top=ax.get_ylim()[1] * 12)  # room for the legend above the lines
    ax.legend(fontsize=6, loc="upper left")
    fig.suptitle(f"Global traffic at {hybrid.shape.label()}: the score matrix costs the hybrid L x L bytes, "
                 "each way (from the executor's counts)", fontsize=8.5)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


# --- staging through shared memory (chapter 5) --------------------------------------------------

STAGING_KINDS = {"wmma load": 0, "wmma store": 9, "shared load": 1, "shared store": 3}  # tab10 colours


def _run_spans(e) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi) of each access event's run of shared bytes."""
    off = e["offset"].astype(np.int64)
    reach = e["stride"].astype(np.int64) * (e["count"].astype(np.int64) - 1)
    return off + np.minimum(reach, 0), off + np.maximum(reach, 0) + e["bytes"].astype(np.int64)


def shared_bands(t: Trace, steps, launch: int = 0) -> list[tuple[int, int]]:
    """The traced CTA's tiles in shared memory during `steps`, as its stores show them: each source
    line that writes shared memory covers the range [lo, hi) from its lowest to its highest byte,
    and overlapping ranges (one tile, several writers) merge. Padding between rows cannot tell two
    tiles apart; their writers can."""
    ev = t.launches[launch].events
    e = ev[(ev["kind"] == EVENT_KINDS.index("access")) & (ev["buffer"] == -1) & (ev["write"] == 1)
           & np.isin(ev["step"], list(steps))]
    lo, hi = _run_spans(e)
    per_site: dict[int, list[int]] = {}
    for site, a, b in zip(e["site"].tolist(), lo.tolist(), hi.tolist()):
        span = per_site.setdefault(site, [a, b])
        span[0], span[1] = min(span[0], a), max(span[1], b)
    bands: list[list[int]] = []
    for a, b in sorted(per_site.values()):
        if bands and a < bands[-1][1]:
            bands[-1][1] = max(bands[-1][1], b)
        else:
            bands.append([a, b])
    return [(a, b) for a, b in bands]


def staging_figure(t: Trace, warp: int = 0, title: str | None = None, launch: int = 0):
    """One warp's first key tile of math, in the order it ran (each column one stretch between two
    meetings of the warp: a WMMA operation, a __syncwarp or a shuffle): which shared-memory bytes each
    source line read or wrote, WMMA's fragment loads and stores apart from the lanes' own loads and
    stores, and where the tensor cores ran. Shared memory's ranges are labelled by the line that
    filled them from global memory (the step before) or first wrote them in this one."""
    if t is None:
        return None
    import matplotlib.pyplot as plt

    c = t.launches[launch]
    ev = c.events
    w = ev[ev["warp"] == warp]
    mma_kinds = [EVENT_KINDS.index("wmma mma"), EVENT_KINDS.index("mma.sync")]
    mma = w[np.isin(w["kind"], mma_kinds)]
    if not len(mma):
        return None
    step = int(mma["step"].min())
    sel = w[w["step"] == step]
    epochs = np.unique(sel["epoch"])
    col = {int(e): i for i, e in enumerate(epochs)}
    acc = sel[(sel["kind"] == EVENT_KINDS.index("access")) & (sel["buffer"] == -1)]
    lo, hi = _run_spans(acc)
    places = short_places([s.where for s in c.sites])
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 3.8))
    spans: dict[tuple[int, int], list[int]] = {}
    for e, a, b in zip(acc, lo.tolist(), hi.tolist()):
        key = (int(e["epoch"]), int(e["site"]))
        span = spans.setdefault(key, [a, b])
        span[0], span[1] = min(span[0], a), max(span[1], b)
    shown = set()
    for (epoch, site), (a, b) in spans.items():
        kind = c.sites[site].kind
        shift = {"wmma load": -0.2, "shared load": -0.2, "wmma store": 0.2, "shared store": 0.2}.get(kind, 0)
        ax.plot([col[epoch] + shift] * 2, [a, b], lw=2.2, solid_capstyle="butt",
                color=colors[STAGING_KINDS.get(kind, 7)], label=None if kind in shown else kind)
        shown.add(kind)
    mma_cols = sorted({col[int(e)] for e in sel["epoch"][np.isin(sel["kind"], mma_kinds)]})
    bands = shared_bands(t, (step - 1, step), launch)
    top = max(b for _, b in bands) if bands else 1
    ax.scatter(mma_cols, [-0.04 * top] * len(mma_cols), marker="|", s=40, color="black", label="tensor-core mma")
    writes = ev[(ev["kind"] == EVENT_KINDS.index("access")) & (ev["buffer"] == -1) & (ev["write"] == 1)
                & np.isin(ev["step"], [step - 1, step])]
    w_lo, _ = _run_spans(writes)
    for i, (a, b) in enumerate(bands):
        ax.axhspan(a, b, color="0.93" if i % 2 else "0.86", zorder=0, lw=0)
        inside = writes[(w_lo >= a) & (w_lo < b)]
        earlier = inside[inside["step"] < step]
        first = (earlier if len(earlier) else inside)
        name = ""
        if len(first):
            site = c.sites[int(first["site"][np.argmin(first["seq"])])]
            how = "filled from global" if len(earlier) else f"written first by {site.kind}"
            name = f"{how} at {site_label(places[site.where])}"
        ax.text(1.01, (a + b) / 2, f"bytes {a:,}-{b:,}\n{name}", transform=ax.get_yaxis_transform(),
                va="center", fontsize=6.3)
    ax.set_xlim(-1, len(epochs))
    ax.set_ylim(top * 1.02, -0.08 * top)
    ax.set_xlabel(f"warp {warp}'s operations in order, between its meetings (key tile 0: step {step}); "
                  "an order, not a time", fontsize=7.5)
    ax.set_ylabel("shared-memory byte offset", fontsize=7.5)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6.5, loc="lower left", ncol=5, bbox_to_anchor=(0, 1.0), frameon=False)
    fig.suptitle(title or f"{t.kernel}: one warp's round trips through shared memory (from the executor's trace)",
                 fontsize=8.5, y=0.995)
    fig.subplots_adjust(left=0.09, right=0.7, top=0.86, bottom=0.13)
    return fig


# --- the pipeline ------------------------------------------------------------------------------

def stage_regions(t: Trace, launch: int = 0) -> list[tuple[int, int]]:
    """The shared-memory ranges [lo, hi) the traced CTA's cp.async groups fill, one per stage of its
    ring, in address order: each commit group after the first (the first may bring Q along) fills
    one; a kernel with a single group has one stage."""
    ev = t.launches[launch].events
    cp = ev[ev["kind"] == EVENT_KINDS.index("cp.async")]
    if not len(cp):
        return []
    groups = np.unique(cp["arg"])
    steady = groups[groups >= 1] if (groups >= 1).any() else groups
    regions = {(int(cp["offset"][cp["arg"] == g].min()), int(cp["offset"][cp["arg"] == g].max()) + 16) for g in steady}
    return sorted(regions)


def _stage_of(regions: list[tuple[int, int]], offsets) -> np.ndarray:
    """The ring stage (index into stage_regions) each shared offset falls in, -1 for none."""
    offsets = np.asarray(offsets, np.int64)
    if not regions:
        return np.full(offsets.shape, -1)
    lo = np.array([r[0] for r in regions])
    hi = np.array([r[1] for r in regions])
    idx = np.searchsorted(lo, offsets, side="right") - 1
    ok = (idx >= 0) & (offsets < hi[np.maximum(idx, 0)])
    return np.where(ok, idx, -1)


def _stage_events(t: Trace, launch: int = 0):
    """The traced CTA's accesses of its ring stages: copies as (warp, step, stage, commit group)
    and reads (ldmatrix rows, shared loads, WMMA fragment loads) as (warp, step, stage), each a
    list in program order; None when the kernel has no stages."""
    regions = stage_regions(t, launch)
    if not regions:
        return None
    ev = t.launches[launch].events
    cp = ev[ev["kind"] == EVENT_KINDS.index("cp.async")]
    reads = ev[(ev["buffer"] == -1) & (ev["write"] == 0) &
               np.isin(ev["kind"], [EVENT_KINDS.index("access"), EVENT_KINDS.index("ldmatrix")])]
    copies = [c for c in zip(cp["warp"].tolist(), cp["step"].tolist(), _stage_of(regions, cp["offset"]).tolist(),
                             cp["arg"].tolist()) if c[2] >= 0]
    read = [r for r in zip(reads["warp"].tolist(), reads["step"].tolist(),
                           _stage_of(regions, reads["offset"]).tolist()) if r[2] >= 0]
    return copies, read


def pipeline_events(t: Trace, launch: int = 0) -> dict[tuple[int, int], tuple[set, set]]:
    """(warp, step) -> (stages it issued cp.async copies into, stages it read from shared memory):
    reads are ldmatrix rows, shared loads and WMMA fragment loads whose bytes fall in a stage."""
    events = _stage_events(t, launch)
    out: dict[tuple[int, int], tuple[set, set]] = {}
    for w, s, st, _ in (events[0] if events else ()):
        out.setdefault((w, s), (set(), set()))[0].add(st)
    for w, s, st in (events[1] if events else ()):
        out.setdefault((w, s), (set(), set()))[1].add(st)
    return out


def ring_ops(t: Trace, warp: int, launch: int = 0) -> list[tuple]:
    """The traced CTA's warp `warp` in program order, as attnlab.book.ring.ring_protocol writes a
    role's hand-off: its lowest lane's ("sync", id) and ("arrive", id) barriers, ("wait", pending)
    and ("commit", group), its cp.async copies as ("copy", stage, group) (one per group), and after
    each barrier the ring stages any of its lanes read, as ("read", stage)."""
    regions = stage_regions(t, launch)
    ev = t.launches[launch].events
    ev = ev[ev["warp"] == warp]
    lane = int(ev["lane"][ev["lane"] != WARP_EVENT_LANE].min())
    reads: dict[int, set] = {}
    loads = ev[(ev["buffer"] == -1) & (ev["write"] == 0) & (ev["kind"] == EVENT_KINDS.index("access"))]
    for step, st in zip(loads["step"].tolist(), _stage_of(regions, loads["offset"]).tolist()):
        if st >= 0:
            reads.setdefault(step, set()).add(st)
    out: list[tuple] = []
    names = {"bar.sync": "sync", "bar.arrive": "arrive", "wait_group": "wait", "commit": "commit"}
    for e in ev[ev["lane"] == lane]:
        kind = EVENT_KINDS[e["kind"]]
        if kind == "cp.async":
            op = ("copy", int(_stage_of(regions, e["offset"])), int(e["arg"]))
            if not out or out[-1] != op:
                out.append(op)
        elif kind in names:
            out.append((names[kind], int(e["arg"])))
            if kind.startswith("bar."):
                out += [("read", st) for st in sorted(reads.get(int(e["step"]) + 1, ()))]
    return out


def pipeline_tiles(t: Trace, launch: int = 0) -> dict[tuple[int, int], tuple[set, set]]:
    """pipeline_events with key tiles instead of stages: (warp, step) -> (the tiles it issued
    copies of, the tiles it read). A copy's tile is its cp.async commit group (one group per key
    tile, in order; Q rides in the first), a read's the last tile its warp copied into that stage."""
    events = _stage_events(t, launch)
    out: dict[tuple[int, int], tuple[set, set]] = {}
    filled: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (warp, stage) -> [(step, tile)]
    for w, s, st, group in (events[0] if events else ()):
        out.setdefault((w, s), (set(), set()))[0].add(group)
        filled.setdefault((w, st), []).append((s, group))
    for w, s, st in (events[1] if events else ()):
        tiles = [g for step, g in filled.get((w, st), ()) if step < s]
        if tiles:
            out.setdefault((w, s), (set(), set()))[1].add(max(tiles))
    return out


def _draw_pipeline(ax, t: Trace, launch: int = 0, tiles: bool = False) -> list:
    """pipeline_figure's drawing on one axis; the legend's handles (one per stage). `tiles`: label
    each copy and read with its key tile (coloured by stage) instead of its stage."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    cells = pipeline_tiles(t, launch) if tiles else pipeline_events(t, launch)
    stage_of_tile = {group: st for _, _, st, group in (_stage_events(t, launch) or ((), ()))[0]} if tiles else {}
    regions = stage_regions(t, launch)
    c = t.launches[launch]
    warps = int(np.prod(c.block)) // 32
    steps = int(c.events["step"].max(initial=0)) + 1
    palette = plt.get_cmap("Set2").colors
    for (w, s), (copies, reads) in cells.items():
        for top, (letter, items) in ((w - 0.45, ("c", copies)), (w, ("r", reads))):  # (y grows downward)
            items = sorted(items)
            for i, item in enumerate(items):
                st = stage_of_tile[item] if tiles else item
                width = 0.9 / len(items)
                ax.add_patch(Rectangle((s - 0.45 + i * width, top), width, 0.43, fc=palette[st % len(palette)],
                                       ec="white", lw=0.4))
                ax.text(s - 0.45 + (i + 0.5) * width, top + 0.215, f"{letter}{item}", ha="center", va="center",
                        fontsize=5.5)
    ax.set_xlim(-0.6, steps - 0.4)
    ax.set_ylim(warps - 0.5, -0.5)
    ax.set_yticks(range(warps))
    ax.set_yticklabels([f"warp {w}" for w in range(warps)], fontsize=7)
    ax.set_xlabel("step: block barriers passed (an order of events, not time)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    return [Patch(fc=palette[i % len(palette)], label=f"stage {i}: shared bytes {lo:,}-{hi:,}")
            for i, (lo, hi) in enumerate(regions)]


def pipeline_figure(t: Trace, title: str | None = None, launch: int = 0):
    """Per warp and step (block barriers passed) of the traced CTA: the K/V stages it issues cp.async
    copies into (upper half of the cell) and the stages it reads (lower half). An order of events,
    not a time axis."""
    if t is None:
        return None
    import matplotlib.pyplot as plt

    warps = int(np.prod(t.launches[launch].block)) // 32
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 0.42 * warps + 1.5))
    handles = _draw_pipeline(ax, t, launch)
    ax.legend(handles=handles, fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=max(1, len(handles)),
              frameon=False)
    ax.set_title(title or f"{t.kernel}, CTA {t.launches[launch].traced_block}: cN = cp.async copies into stage N "
                          "(upper half), rN = reads of stage N (lower half)", fontsize=8.5)
    fig.tight_layout()
    return fig


def pipeline_pair(before: Trace, after: Trace, steps: int | None = None):
    """pipeline_figure of two kernels, one above the other on the same step axis, each copy and read
    labelled with its key tile (the first `steps` steps, all of the longer by default): how a change
    of the loop moves copies and reads between the barriers."""
    if before is None or after is None:
        return None
    import matplotlib.pyplot as plt

    warps = max(int(np.prod(t.launches[0].block)) // 32 for t in (before, after))
    fig, axes = plt.subplots(2, 1, figsize=(FIGURE_WIDTH, 2 * (0.36 * warps + 1.0) + 0.6), sharex=True)
    handles = []
    for ax, t in zip(axes, (before, after)):
        h = _draw_pipeline(ax, t, tiles=True)
        handles = h if len(h) > len(handles) else handles
        ax.set_title(f"{t.kernel}, CTA {t.launches[0].traced_block}", fontsize=8)
    longest = max(int(t.launches[0].events["step"].max(initial=0)) + 1 for t in (before, after))
    axes[-1].set_xlim(-0.6, (steps or longest) - 0.4)
    axes[0].set_xlabel("")
    axes[-1].legend(handles=handles, fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.35),
                    ncol=max(1, len(handles)), frameon=False)
    fig.suptitle("cN = cp.async copies of key tile N issued (upper half of a cell), rN = reads of key tile N "
                 "(lower half); colour: the stage", fontsize=8.5)
    fig.tight_layout()
    return fig


# --- per source line -------------------------------------------------------------------------

def site_bars(t: Trace, kinds=("exp", "shuffle"), title: str | None = None):
    """Per source line, the operations of `kinds` over every CTA: thread operations (lanes) for
    exponentials, warp-wide instructions for the rest; the ideal exponentials as a line."""
    if t is None:
        return None
    import matplotlib.pyplot as plt

    sites = [s for s in t.sites() if s.kind in kinds]
    places = short_places([s.where for s in sites])
    values = [s.lanes if s.kind == "exp" else s.requests for s in sites]
    labels = [f"{site_label(places[s.where])} {s.kind}" + (" (per thread)" if s.kind == "exp" else " (per warp)")
              for s in sites]
    fig, ax = plt.subplots(figsize=(FIGURE_WIDTH, 0.32 * len(sites) + 1.3))
    colors = [plt.get_cmap(WARP_CMAP).colors[list(kinds).index(s.kind)] for s in sites]
    ax.barh(range(len(sites)), values, color=colors)
    ax.set_yticks(range(len(sites)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,}", va="center", fontsize=6.5)
    ideal = ideal_counts(t.shape, t.causal)["exps"]
    if "exp" in kinds:
        ax.axvline(ideal, color="black", lw=0.8, ls="--", label=f"one exponential per score: {ideal:,}")
        ax.legend(fontsize=7, loc="upper right")
    ax.set_xlabel("count over every CTA (measured on the CPU executor)", fontsize=8)
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:,.0f}")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlim(0, max(values + [ideal]) * 1.25)
    ax.set_title(title or f"{t.kernel} at {t.shape.label()}: where the exponentials and shuffles are", fontsize=8.5)
    fig.tight_layout()
    return fig


def glue_counts(prefix: str, t: Trace) -> dict[str, int]:
    """Glue `t`'s counts for the prose: `{prefix}_<key>` for every total (thousands separated),
    `{prefix}_ctas`, `{prefix}_reread` (global bytes read per distinct byte) and
    `{prefix}_exps_per_score` (exponentials per score kept). Returns the totals."""
    from .page import glue

    if t is None:  # not counted on this machine: the prose's numbers say so
        for key in dict.fromkeys((*BLOCK_FIELDS, "global_distinct_read", "global_distinct_write", "global_requests",
                                  "global_sectors", "global_excess_sectors", "shared_excess_wavefronts",
                                  "tensor_instructions", "ctas", "reread", "exps_per_score")):
            glue(f"{prefix}_{key}", "(not counted)")
        return {}
    tot = t.totals()
    for key, value in tot.items():
        glue(f"{prefix}_{key}", f"{value:,}")
    glue(f"{prefix}_ctas", f"{sum(int(np.prod(c.grid)) for c in t.launches):,}")
    glue(f"{prefix}_reread", f"{tot['global_read'] / max(tot['global_distinct_read'], 1):.1f}")
    glue(f"{prefix}_exps_per_score", f"{tot['exps'] / ideal_counts(t.shape, t.causal)['exps']:.2f}")
    return tot


def page_traces() -> list[tuple]:
    """Every trace the book's pages draw on, as executor.trace.warm takes them: each chapter's kernel
    and the kernels its section compares, at the mission shape on the GPU at hand (the L4's geometry
    without one), and each chapter's kernel at the geometry of every GPU the model predicts for,
    with chapter 7's causal grid."""
    from ..gpus import by_key
    from ..model.bounds import PREDICTED_GPUS
    from .scoreboard import chapter_kernels

    from ..kernels.registry import STEPS_07

    chapters = list(chapter_kernels().values())
    steps = [s.kernel_id for s in STEPS_07 if s.kernel_id not in chapters]
    out = [(k, tuple(MISSION), False, None, None) for k in chapters + steps]
    for key in PREDICTED_GPUS:
        g = by_key(key)
        out += [(k, tuple(MISSION), False, g.arch, g.sms) for k in chapters + steps]
        out += [(k, tuple(MISSION), True, g.arch, g.sms) for k in ("07_mma", *steps[:2])]  # 7.2's launch order
    return out


def main() -> int:
    """`python -m attnlab.book.executor_view`: make every trace the pages draw on, all cores at once,
    so that each page then reads them from the cache (a GPU session's book stage runs this first)."""
    import sys

    from ..executor.trace import warm

    failed = warm(page_traces())
    for line in failed:
        print(line, file=sys.stderr)
    print(f"{len(page_traces()) - len(failed)} traces ready, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
