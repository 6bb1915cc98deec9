"""Shared-memory banks for one warp-wide access: which 4-byte word and bank each lane's bytes fall
in, how many wavefronts the access takes, and chapter 1's bank figure (lanes -> words -> banks).

The rule is the one the CPU executor counts by (src/attnlab/executor/runtime/banks.cpp): shared
memory has 32 banks of 4-byte words, word w in bank w mod 32; an access takes as many wavefronts as
its busiest bank has distinct words, so lanes that read the same word share it (a broadcast), and
two lanes reading the two halves of one word cost one word, not two. 8-byte accesses are served a
half-warp at a time and 16-byte ones a quarter-warp at a time.
"""
from __future__ import annotations

from dataclasses import dataclass

BANKS = 32
WORD_BYTES = 4


@dataclass(frozen=True)
class WarpAccess:
    offsets: tuple[int, ...]     # each lane's byte offset in shared memory
    size: int                    # bytes per lane
    words: tuple[tuple[int, ...], ...]  # each lane's 4-byte words
    wavefronts: int

    @property
    def banks(self) -> tuple[tuple[int, ...], ...]:
        """Each lane's banks."""
        return tuple(tuple(w % BANKS for w in ws) for ws in self.words)

    @property
    def distinct_words(self) -> list[int]:
        return sorted({w for ws in self.words for w in ws})

    @property
    def busy_banks(self) -> list[int]:
        return sorted({w % BANKS for w in self.distinct_words})

    @property
    def lanes_per_word(self) -> int:
        """The most lanes that read one word (2 for 32 consecutive halves)."""
        from collections import Counter

        return max(Counter(w for ws in self.words for w in ws).values())


def warp_access(offsets, size: int) -> WarpAccess:
    """One warp-wide shared-memory access: lane i reads `size` bytes at byte offset offsets[i]."""
    offsets = tuple(int(o) for o in offsets)
    words = tuple(tuple(range(o // WORD_BYTES, (o + size - 1) // WORD_BYTES + 1)) for o in offsets)
    per_phase = 8 if size >= 16 else 16 if size == 8 else 32
    wavefronts = 0
    for p in range(0, len(offsets), per_phase):
        phase = {w for ws in words[p:p + per_phase] for w in ws}
        per_bank: dict[int, int] = {}
        for w in phase:
            per_bank[w % BANKS] = per_bank.get(w % BANKS, 0) + 1
        wavefronts += max(per_bank.values(), default=0)
    return WarpAccess(offsets, size, words, wavefronts)


def column_major_halves(d: int = 0, threads: int = 128, warp: int = 0) -> WarpAccess:
    """Chapter 1's read of its query tile: lane i of warp `warp` reads q_s[d * THREADS + row], one
    fp16 (2 bytes), where row = 32 * warp + i (kernels/01_scalar.cu)."""
    return warp_access([2 * (d * threads + 32 * warp + lane) for lane in range(32)], 2)


def bank_figure(access: WarpAccess, title: str):
    """Lanes -> the 4-byte words they read -> the banks that hold those words, for one warp-wide
    access of at most 4 bytes per lane: one row of boxes each, a line from each word to its bank,
    the busy banks coloured and the idle ones grey."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    assert access.size <= WORD_BYTES and len(access.offsets) == 32, "one word per lane, 32 lanes"
    words = access.distinct_words
    first = min(access.offsets)
    fig, ax = plt.subplots(figsize=(7, 3.3))
    y_lane, y_word, y_bank, h = 3.0, 1.75, 0.0, 0.62
    cmap = plt.get_cmap("tab20")
    color = {w: cmap(i % 20) for i, w in enumerate(words)}
    x_word = {}
    for lane, (off, (w,)) in enumerate(zip(access.offsets, access.words)):
        ax.add_patch(Rectangle((lane + 0.05, y_lane), 0.9, h, fc=color[w], ec="black", lw=0.5))
        ax.text(lane + 0.5, y_lane + h / 2, str(lane), ha="center", va="center", fontsize=6.5)
        # the word box sits under its bytes: 4 bytes wide, at the lanes whose bytes it holds
        x_word.setdefault(w, []).append(lane)
    for w, lanes in x_word.items():
        x0, x1 = min(lanes), max(lanes) + 1
        ax.add_patch(Rectangle((x0 + 0.05, y_word), x1 - x0 - 0.1, h, fc=color[w], ec="black", lw=0.5))
        ax.text((x0 + x1) / 2, y_word + h / 2, f"w{w - first // WORD_BYTES}", ha="center", va="center",
                fontsize=6.5)
        for lane in lanes:
            ax.plot([lane + 0.5, lane + 0.5], [y_lane, y_word + h], color="gray", lw=0.6)
        bank = w % BANKS
        ax.plot([(x0 + x1) / 2, bank + 0.5], [y_word, y_bank + h], color=color[w], lw=1.2)
    busy = set(access.busy_banks)
    for bank in range(BANKS):
        fc = color[next(w for w in words if w % BANKS == bank)] if bank in busy else "#eeeeee"
        ax.add_patch(Rectangle((bank + 0.05, y_bank), 0.9, h, fc=fc, ec="black" if bank in busy else "#bbbbbb",
                               lw=0.5))
        ax.text(bank + 0.5, y_bank + h / 2, str(bank), ha="center", va="center", fontsize=6.5,
                color="black" if bank in busy else "#999999")
    for y, label in ((y_lane, "lane"), (y_word, "4-byte word"), (y_bank, "bank")):
        ax.text(-0.4, y + h / 2, label, ha="right", va="center", fontsize=8)
    ax.set_xlim(-4.6, 32.2)
    ax.set_ylim(-0.75, y_lane + h + 0.1)
    ax.axis("off")
    most = max(sum(1 for w in words if w % BANKS == b) for b in busy)
    ax.text(16, -0.45, f"{len(access.offsets)} lanes, {access.size} bytes each: {len(words)} words, "
            f"{access.lanes_per_word} lanes per word, in {len(busy)} of the {BANKS} banks, at most {most} "
            f"word{'s' if most != 1 else ''} per bank: {access.wavefronts} "
            f"wavefront{'s' if access.wavefronts != 1 else ''}", ha="center", va="center", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
