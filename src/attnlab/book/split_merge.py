"""Chapter 7's key split as arithmetic: what each warp group of a CTA computes over its slice of
every key tile, and the merge that makes one answer of them (kernels/07_mma_swizzle.cu).

With a split of s, group g takes keys [g n/s, (g+1) n/s) of each n-key tile and keeps its own
online-softmax state per query row: the running max m_g, the sum l_g of exp(scale (x - m_g)) and
the unnormalised output O_g. The merge rescales each state to the common max m = max_g m_g:

    l = sum_g exp(scale (m_g - m)) l_g,     O = sum_g exp(scale (m_g - m)) O_g,     out = O / l

which is the same algebra as one online-softmax step, so the merged answer is the unsplit one up
to rounding. `split_attention` runs it in NumPy for one head; tests/test_split_merge.py holds it to
the fp64 reference at every split.

FlashAttention-2's route (the ablation 07_mma_split_ctas) cuts the keys differently, into runs of
whole tiles, one per CTA (`cta_keys`), and merges through global memory in a second kernel; the
merge is the same.

    out = split_attention(q, k, v, splits=2, block_n=64, causal=True)   # q, k, v: [L, D] arrays
    out = split_attention(q, k, v, splits=3, block_n=64, route="ctas")
"""
from __future__ import annotations

import numpy as np


def group_keys(L: int, splits: int, block_n: int, group: int) -> np.ndarray:
    """The key indices group `group` multiplies: its slice of every block_n-key tile, below L."""
    if block_n % splits:
        raise ValueError(f"a {block_n}-key tile does not split {splits} ways")
    sub = block_n // splits
    starts = np.arange(0, L, block_n) + group * sub
    keys = (starts[:, None] + np.arange(sub)).ravel()
    return keys[keys < L]


def cta_keys(L: int, splits: int, block_n: int, split: int) -> np.ndarray:
    """The key indices CTA `split` of FA2's split takes: the split-th run of ceil(tiles / splits)
    whole block_n-key tiles, below L (empty when the runs end before it)."""
    per = -(-(-(-L // block_n)) // splits)
    return np.arange(split * per * block_n, min(L, (split + 1) * per * block_n))


def partial_state(q, k, v, keys, scale: float, causal: bool, dtype=np.float64):
    """One group's (m, l, O) for every query row over `keys`: m = -inf, l = 0, O = 0 for a row
    that sees none of them (causal rows before the group's first key)."""
    q, k, v = (np.asarray(t, dtype) for t in (q, k, v))
    s = scale * (q @ k[keys].T)                                       # [L, len(keys)]
    if causal:
        s = np.where(keys[None, :] > np.arange(len(q))[:, None], -np.inf, s)
    m = s.max(axis=1, initial=-np.inf)
    p = np.exp(s - np.where(np.isfinite(m), m, 0)[:, None])           # exp(-inf) = 0 where masked
    return m, p.sum(axis=1), p @ v[keys]


def merge(states):
    """The merged (m, l, O) of several groups' states: each rescaled to the common max."""
    m = np.max([st[0] for st in states], axis=0)
    m_use = np.where(np.isfinite(m), m, 0)
    l = sum(np.exp(mg - m_use) * lg for mg, lg, _ in states)
    o = sum(np.exp(mg - m_use)[:, None] * og for mg, _, og in states)
    return m, l, o


def split_attention(q, k, v, splits: int, block_n: int = 64, causal: bool = False, scale: float | None = None,
                    dtype=np.float64, route: str = "warps"):
    """softmax(scale q k^T [+ causal mask]) v for one head, as `splits` partial states and their
    merge: the warp groups' slices of every tile (route "warps", 07_mma) or the CTAs' runs of
    tiles (route "ctas", 07_mma_split_ctas)."""
    L, D = np.shape(q)
    scale = 1.0 / np.sqrt(D) if scale is None else scale
    keys_of = {"warps": group_keys, "ctas": cta_keys}[route]
    states = [partial_state(q, k, v, keys_of(L, splits, block_n, g), scale, causal, dtype)
              for g in range(splits)]
    _, l, o = merge(states)
    return o / l[:, None]
