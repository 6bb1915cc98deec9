"""The NumPy model of chapter 7's key split (attnlab.book.split_merge) against the fp64 reference, at
every split the kernel builds and beyond, causal and not, by both routes: warp groups inside a
CTA, and FlashAttention-2's runs of tiles across CTAs."""
from __future__ import annotations

import numpy as np
import pytest

from attnlab.pass_rule import make_inputs
from attnlab.reference import reference_attention
from attnlab.shapes import Shape
from attnlab.kernels.registry import cta_split_candidates
from attnlab.book.split_merge import cta_keys, group_keys, merge, partial_state, split_attention


def _head(L, D, seed=0):
    q, k, v = make_inputs(Shape(1, 1, L, D), seed=seed, device="cpu")
    ref = reference_attention(q, k, v, False)[0, 0].numpy()
    ref_causal = reference_attention(q, k, v, True)[0, 0].numpy()
    return q[0, 0].double().numpy(), k[0, 0].double().numpy(), v[0, 0].double().numpy(), ref, ref_causal


# Warp groups split a 64-key tile 1, 2, 4 or 8 ways; runs of tiles split any number of ways.
ROUTES = [("warps", s) for s in (1, 2, 4, 8)] + [("ctas", s) for s in (1, 2, 3, 4, 8)]


@pytest.mark.parametrize("route,splits", ROUTES)
@pytest.mark.parametrize("L", [1, 17, 64, 129, 333])
@pytest.mark.parametrize("causal", [False, True])
def test_every_split_merges_to_the_reference(route, splits, L, causal):
    q, k, v, ref, ref_causal = _head(L, 64)
    out = split_attention(q, k, v, splits, block_n=64, causal=causal, route=route)
    assert np.abs(out - (ref_causal if causal else ref)).max() < 1e-12


def test_the_ctas_take_runs_of_whole_tiles_that_cover_every_key_once():
    for L in (1, 63, 64, 129, 200, 640):
        for splits in range(1, 9):
            runs = [cta_keys(L, splits, 64, z) for z in range(splits)]
            assert np.concatenate(runs).tolist() == list(range(L))
            assert all(len(r) == 0 or r[0] % 64 == 0 for r in runs)
    assert cta_keys(129, 2, 64, 0).tolist() == list(range(128)) and cta_keys(129, 2, 64, 1).tolist() == [128]
    # FA2's candidates leave no CTA without keys: a split that would is never weighed
    assert cta_split_candidates(5, 132) == (1, 2, 3, 5)
    for tiles in range(1, 40):
        for splits in cta_split_candidates(tiles, 132):
            assert all(len(cta_keys(64 * tiles, splits, 64, z)) for z in range(splits)), (tiles, splits)
    # at most one CTA per SM and per key tile, and at most FA2's 128
    assert max(cta_split_candidates(200, 58)) <= 58 and cta_split_candidates(3, 132) == (1, 2, 3)
    assert max(cta_split_candidates(10_000, 1000)) <= 128


def test_the_groups_take_disjoint_slices_that_cover_every_key():
    for L in (1, 63, 64, 200):
        for splits in (1, 2, 4):
            keys = np.concatenate([group_keys(L, splits, 64, g) for g in range(splits)])
            assert sorted(keys.tolist()) == list(range(L))
    assert group_keys(130, 2, 64, 1).tolist() == list(range(32, 64)) + list(range(96, 128))
    with pytest.raises(ValueError):
        group_keys(64, 3, 64, 0)


def test_without_the_rescaling_the_merge_is_wrong():
    q, k, v, ref, _ = _head(129, 64)
    states = [partial_state(q, k, v, group_keys(129, 2, 64, g), 0.125, False) for g in range(2)]
    _, l, o = merge(states)
    assert np.abs(o / l[:, None] - ref).max() < 1e-12
    naive = sum(st[2] for st in states) / sum(st[1] for st in states)[:, None]  # each against its own max
    assert np.abs(naive - ref).max() > 1e-3


def test_a_row_that_one_group_never_sees_merges_cleanly():
    """Causal row 0 sees key 0 only: every other group's state is (-inf, 0, 0) and must add nothing."""
    q, k, v, _, ref_causal = _head(64, 64)
    m, l, o = partial_state(q, k, v, group_keys(64, 4, 64, 3), 0.125, True)
    assert m[0] == -np.inf and l[0] == 0 and not o[0].any()
    assert np.abs(split_attention(q, k, v, 4, causal=True) - ref_causal).max() < 1e-12
