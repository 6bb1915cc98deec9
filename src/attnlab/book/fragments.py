"""Which lane holds which element of an `mma.sync.m16n8k16` fragment, from the PTX ISA's formulas
and read back from execution (kernels/probe_fragments.cu on the CPU executor), and the figures
chapter 7 draws of it: A next to two C blocks repacked as the next MMA's A operand (how the kernel
keeps P in registers), then B and C.
"""
from __future__ import annotations


def mma_m16n8k16_maps() -> dict[str, tuple]:
    """Which (row, col) of A (16x16), B (16x8, k x n) and C/D (16x8) each lane holds in
    mma.sync.aligned.m16n8k16 with .f16 inputs and .f32 accumulators, from the PTX ISA's formulas
    (groupID g = lane >> 2, threadID_in_group t = lane % 4). Returns name -> (rows, cols, regs):
    int arrays [32, n] over the lane's elements in register order (A: a0..a7 in 4 .f16x2
    registers, B: b0..b3 in 2, C: c0..c3 in 4 fp32 registers); regs[lane, i] is the register."""
    import numpy as np

    lane = np.arange(32)[:, None]
    g, t = lane >> 2, lane & 3
    i8, i4 = np.arange(8)[None, :], np.arange(4)[None, :]
    a_rows = g + 8 * ((i8 // 2) % 2)                 # a0,a1: g; a2,a3: g+8; a4,a5: g; a6,a7: g+8
    a_cols = 2 * t + (i8 & 1) + 8 * (i8 >= 4)
    b_rows = 2 * t + (i4 & 1) + 8 * (i4 >= 2)        # b0,b1: k = 2t, 2t+1; b2,b3: 2t+8, 2t+9
    b_cols = np.broadcast_to(g, (32, 4))
    c_rows = g + 8 * (i4 >= 2)                       # c0,c1: g; c2,c3: g+8
    c_cols = 2 * t + (i4 & 1)
    return {"A": (a_rows, a_cols, np.broadcast_to(i8 // 2, (32, 8))),
            "B": (b_rows, np.array(b_cols), np.broadcast_to(i4 // 2, (32, 4))),
            "C": (c_rows, c_cols, np.broadcast_to(i4, (32, 4)))}


def accumulator_pair_as_a() -> tuple:
    """The accumulators of two adjacent n8 blocks (keys 0-7 and 8-15), packed two fp32 values per
    .f16x2 register in the kernel's order (c0c1 and c2c3 of block 0, then of block 1), as
    (rows, cols, regs) [32, 8] over a 16x16 matrix: the same per-lane map as an A fragment when
    the repack is right."""
    import numpy as np

    c_rows, c_cols, _ = mma_m16n8k16_maps()["C"]
    rows = np.concatenate([c_rows, c_rows], axis=1)            # block 0: c0..c3, block 1: c0..c3
    cols = np.concatenate([c_cols, c_cols + 8], axis=1)
    regs = np.broadcast_to(np.arange(8) // 2, (32, 8))         # pa[0] = (c0, c1) of block 0, ...
    return rows, cols, regs


# The book's text column is 700 to 800 CSS px wide and shows a figure scaled down to it when the
# figure is wider (never up): a figure is drawn for the narrowest, and its smallest text must read at
# READABLE_PX or more there (tests/test_book_ch07_helpers.py).
COLUMN_PX = 700
READABLE_PX = 11.0

_REGISTER_NAMES = {"a": [f"{{a{2 * k},a{2 * k + 1}}}" for k in range(4)],
                   "b": [f"{{b{2 * k},b{2 * k + 1}}}" for k in range(2)],
                   "c": [f"c{k}" for k in range(4)], "pa": [f"pa[{k}]" for k in range(4)]}
_FONT_PT = 8.5      # cell labels, ticks, legend: 13 px at the book's 110 dpi
_CELL_IN = 0.22     # one matrix element: 24 px wide, room for two digits at _FONT_PT
_CELL_H_IN = 0.17   # and 19 px high


def _lane_panel(ax, title: str, axis_labels: tuple[str, str], rows, cols, regs, reg_name: str) -> None:
    """One map of lane ownership: each cell labelled with the lane that holds it, coloured by the
    register (asserting that the map covers every element exactly once)."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch

    colors = plt.get_cmap("Pastel1").colors
    nr, nc = int(rows.max()) + 1, int(cols.max()) + 1
    lane_at = np.full((nr, nc), -1)
    reg_at = np.full((nr, nc), -1)
    for lane in range(32):
        for e in range(rows.shape[1]):
            r, c = rows[lane, e], cols[lane, e]
            assert lane_at[r, c] == -1, f"{title}: ({r}, {c}) held twice"
            lane_at[r, c], reg_at[r, c] = lane, regs[lane, e]
    assert (lane_at >= 0).all(), f"{title}: a cell nobody holds"
    ax.imshow(np.array([[colors[reg_at[r, c]] for c in range(nc)] for r in range(nr)]), aspect="auto")
    for r in range(nr):
        for c in range(nc):
            ax.text(c, r, str(lane_at[r, c]), ha="center", va="center", fontsize=_FONT_PT)
    ax.set_xticks(range(0, nc, 2), [str(c) for c in range(0, nc, 2)], fontsize=_FONT_PT)
    ax.set_yticks(range(0, nr, 2), [str(r) for r in range(0, nr, 2)], fontsize=_FONT_PT)
    ax.tick_params(length=2, pad=1)
    ax.set_title(title, fontsize=_FONT_PT + 0.5)
    ax.set_ylabel(axis_labels[0], fontsize=_FONT_PT, labelpad=1)
    ax.set_xlabel(axis_labels[1], fontsize=_FONT_PT, labelpad=1)
    n_regs = int(regs.max()) + 1
    handles = [Patch(color=colors[k], label=_REGISTER_NAMES[reg_name][k]) for k in range(n_regs)]
    ax.legend(handles=handles, fontsize=_FONT_PT, ncol=4 if n_regs == 4 and nc > 8 else 2, loc="upper center",
              bbox_to_anchor=(0.5, -0.1), frameon=False, handlelength=1, columnspacing=0.8, borderaxespad=0)


def mma_fragment_figure(maps: dict | None = None, source: str = ""):
    """Four maps of lane ownership in mma.sync.m16n8k16, each cell labelled with the lane that
    holds it and coloured by the 32-bit register, sized to read at the book's column width: A above
    two C blocks of S packed as the kernel packs P (which must read exactly like A), B above C/D
    (the block P is packed from). `maps`: as mma_m16n8k16_maps returns them (the default), or as
    executed_maps reads them back from the CPU executor."""
    import matplotlib.pyplot as plt

    maps = maps or mma_m16n8k16_maps()
    grid = [[("A (16x16, row): Q, or P", ("m", "k"), maps["A"], "a"),
             ("B (16x8, col): K^T or V", ("k", "n"), maps["B"], "b")],
            [("two C blocks of S, packed as P", ("m", "k"), accumulator_pair_as_a(), "pa"),
             ("C/D (16x8, fp32): S or O", ("m", "n"), maps["C"], "c")]]
    widths = [int(panel[2][1].max()) + 1 for panel in grid[0]]      # 16 and 8 columns
    rows = sum(int(row[0][2][0].max()) + 1 for row in grid)          # 16 + 16 rows
    fig, axes = plt.subplots(2, 2, figsize=(_CELL_IN * sum(widths) + 1.0, _CELL_H_IN * rows + 2.6),
                             gridspec_kw={"width_ratios": widths})
    for ax_row, row in zip(axes, grid):
        for ax, (title, labels, (r, c, regs), reg_name) in zip(ax_row, row):
            _lane_panel(ax, title, labels, r, c, regs, reg_name)
    fig.suptitle("mma.sync.m16n8k16: the lane (0-31) that holds each element"
                 + (f",\n{source}" if source else "") + ";\n"
                 "colour = its 32-bit register (A, B and P: two fp16 per register)", fontsize=_FONT_PT + 0.5)
    fig.tight_layout()
    return fig


def smallest_text_px(fig, dpi: float, column_px: float = COLUMN_PX) -> float:
    """The smallest visible text of `fig`, in CSS px as the book shows it: fontsize in points at
    `dpi`, times the scale of a PNG of the figure at `dpi` fitted to a `column_px` column (never
    enlarged)."""
    from matplotlib.text import Text

    width_px = fig.get_size_inches()[0] * dpi
    scale = min(1.0, column_px / width_px)
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) * dpi / 72 * scale


def maps_for_page() -> tuple[dict, str]:
    """(maps, where they come from): executed_maps where the CPU executor can run (a C++ compiler),
    else the ISA's formulas, and the figure says which."""
    from ..executor.build import ExecutorUnavailable

    try:
        return executed_maps(), "as the CPU executor ran kernels/probe_fragments.cu"
    except ExecutorUnavailable:
        return mma_m16n8k16_maps(), "from the PTX ISA's formulas (no C++ compiler here to run the probe)"


def executed_maps() -> dict[str, tuple]:
    """mma_m16n8k16_maps read back from execution: kernels/probe_fragments.cu run on the CPU
    executor loads A (a 16 x 16 block of Q) and B (keys 0-7 of a K tile) with ldmatrix as chapter 7
    loads them, from swizzled tiles whose elements hold their own coordinates, and computes D = A B
    with B the identity. The value a lane holds names the element: (rows, cols, regs) per operand."""
    import ctypes

    import numpy as np

    from ..executor.library import load

    lib = load("probe_fragments.cu", ["attn_probe_fragments"])
    r, c = np.meshgrid(np.arange(16), np.arange(64), indexing="ij")
    coords = np.where(c < 16, 16 * r + c, 0).astype(np.float16)   # element (r, c) holds 16 r + c
    identity = (c == r).astype(np.float16)                          # K = I: D = A B = A

    def run(a, k):
        ptrs = []
        for arr in (a, k):
            p = lib.alloc(arr.nbytes)
            ctypes.memmove(p, arr.ctypes.data, arr.nbytes)
            ptrs.append(p)
        outs = [np.zeros(n, np.float32) for n in (32 * 8, 32 * 4, 32 * 4)]
        ptrs += [lib.alloc(o.nbytes) for o in outs]
        report = lib.launch("attn_probe_fragments", (1,), (32,), 0, ptrs)
        assert report.clean, [f.line("probe_fragments") for f in report.findings]
        for o, p in zip(outs, ptrs[2:]):
            ctypes.memmove(o.ctypes.data, p, o.nbytes)
        lib.free_all()
        return outs

    out_a, out_b, _ = run(coords, coords)
    _, _, out_d = run(coords, identity)
    a = out_a.reshape(32, 8).astype(np.int64)
    b = out_b.reshape(32, 4).astype(np.int64)
    d = out_d.reshape(32, 4).astype(np.int64)
    return {"A": (a // 16, a % 16, np.broadcast_to(np.arange(8) // 2, (32, 8))),
            "B": (b % 16, b // 16, np.broadcast_to(np.arange(4) // 2, (32, 4))),   # B[k][n] = K[n][k]
            "C": (d // 16, d % 16, np.broadcast_to(np.arange(4), (32, 4)))}
