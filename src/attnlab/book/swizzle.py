"""The XOR swizzle of chapter 7's shared-memory tiles: byte offsets, the rows and chunks each lane
of `ldmatrix` reads, the wavefronts a request costs, and the bank-map figure.

The formulas are those of kernels/swizzle.cuh, written again in Python; swizzle_header_matches()
checks them against the header's text, so that the page fails rather than drift from the kernel.
"""
from __future__ import annotations


# kernels/swizzle.cuh, written again (swizzle_header_matches() holds the two together).
_SWIZZLE_HEADER_LINES = (
    "return row * ROW_BYTES + ((SWIZZLE ? (chunk ^ (row & 7)) : chunk) << 4);",
    "ldsm_row(int lane) { return lane & 15; }",
    "ldsm_chunk(int lane) { return lane >> 4; }",
    "ldsm_row_b(int lane) { return (lane & 7) + ((lane >> 4) << 3); }",
    "ldsm_chunk_b(int lane) { return (lane >> 3) & 1; }",
)


def swizzle_header_matches() -> bool:
    """True when kernels/swizzle.cuh still holds the formulas that swizzle_offset() and
    ldsm_lane_rows_chunks() compute."""
    from ..paths import kernels_dir

    flat = " ".join((kernels_dir() / "swizzle.cuh").read_text().split())
    return all(line in flat for line in _SWIZZLE_HEADER_LINES)


def swizzle_offset(row, chunk, row_bytes: int, swizzle: bool = True):
    """attn::tile_offset<ROW_BYTES, SWIZZLE>: the byte offset of 16-byte chunk `chunk` of tile row
    `row` (NumPy arrays welcome)."""
    assert row_bytes % 128 == 0
    return row * row_bytes + (((chunk ^ (row & 7)) if swizzle else chunk) << 4)


def ldsm_lane_rows_chunks(order: str = "A"):
    """The (row, chunk) inside a 16-row x 2-chunk block whose address each lane gives ldmatrix.x4:
    order "A" (Q; V with .trans) or "B" (K), as kernels/swizzle.cuh defines them."""
    import numpy as np

    lane = np.arange(32)
    if order == "A":
        return lane & 15, lane >> 4
    if order == "B":
        return (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1
    raise ValueError(f"order must be 'A' or 'B', not {order!r}")


def smem_wavefronts(addr, width: int = 16) -> int:
    """Shared-memory wavefronts of one warp-wide access of `width` bytes per lane at byte addresses
    `addr` [32]: 16-byte accesses (ldmatrix rows, 16-byte loads) are served a quarter-warp (one
    8x8 matrix) per phase, 4-byte ones all 32 lanes at once; a phase needs as many wavefronts as
    its busiest of the 32 four-byte banks has distinct words (attnlab.book.banks.warp_access, the CPU
    executor's rule). A conflict-free ldmatrix.x4: 4."""
    from .banks import warp_access

    return warp_access(addr, width).wavefronts


def ldmatrix_wavefronts_07(D: int, block_m: int, block_n: int, swizzle: bool) -> dict[str, list[int]]:
    """Wavefronts of every ldmatrix.x4 chapter 7's kernel issues for one key tile (Q once, K and V
    per tile), by operand, from its address formulas (the tile bases are multiples of 128 bytes,
    so only the offset inside a tile decides the banks)."""
    rb = 2 * D
    out = {"Q": [], "K": [], "V (.trans)": []}
    ra, ca = ldsm_lane_rows_chunks("A")
    rb_, cb = ldsm_lane_rows_chunks("B")
    for warp in range(block_m // 16):
        for ks in range(D // 16):
            out["Q"].append(smem_wavefronts(swizzle_offset(warp * 16 + ra, 2 * ks + ca, rb, swizzle)))
    for np_ in range(block_n // 16):
        for ks in range(D // 16):
            out["K"].append(smem_wavefronts(swizzle_offset(16 * np_ + rb_, 2 * ks + cb, rb, swizzle)))
    for kp in range(block_n // 16):
        for dp in range(D // 16):
            out["V (.trans)"].append(smem_wavefronts(swizzle_offset(16 * kp + ra, 2 * dp + ca, rb, swizzle)))
    return out


def swizzle_figure(row_bytes: int = 128):
    """Rows 0-7 of a tile in shared memory, plain and swizzled: each cell is a 16-byte slot (a
    group of 4 banks), labelled with the chunk of the row stored there; the slots that one
    ldmatrix phase reads (chunk 0 of rows 0-7) are highlighted."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, sw in zip(axes, (False, True)):
        grid = np.zeros((8, 8), int)
        for r in range(8):
            for c in range(8):
                slot = (swizzle_offset(r, c, row_bytes, sw) % 128) // 16
                grid[r, slot] = c
        ax.imshow(grid == 0, cmap="Oranges", vmin=0, vmax=1.6, aspect="equal")
        for r in range(8):
            for s in range(8):
                ax.text(s, r, f"c{grid[r, s]}", ha="center", va="center", fontsize=9,
                        fontweight="bold" if grid[r, s] == 0 else "normal")
        ax.set_xticks(range(8), [f"{4 * s}-{4 * s + 3}" for s in range(8)], fontsize=7)
        ax.set_yticks(range(8), [str(r) for r in range(8)])
        ax.set_xlabel("banks (16-byte slot of a 128-byte line)")
        ax.set_ylabel("tile row")
        busiest = max(int((grid[:, s] == 0).sum()) for s in range(8))
        ax.set_title(("swizzled: chunk c at slot c ^ (row % 8)" if sw else "plain row-major: chunk c at slot c")
                     + f"\nldmatrix phase (chunk 0, rows 0-7): {busiest} row(s) per bank group", fontsize=9)
    fig.tight_layout()
    return fig
