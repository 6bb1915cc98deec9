import math
import re

import pytest

from attnlab.kernels import registry
from attnlab.kernels.registry import L4_MAX_SMEM_PER_BLOCK, KERNELS
from attnlab.shapes import CHECK_SHAPES, MISSION, Shape

SPECS = list(KERNELS.values())


def test_ids_are_unique_and_prefixed_by_chapter():
    assert len({s.id for s in SPECS}) == len(SPECS)
    for s in SPECS:
        assert s.id.startswith(f"{s.chapter:02d}_"), s.id
        assert s.source.startswith(f"{s.chapter:02d}_"), s.source


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_source_exists_and_defines_entry(spec):
    text = spec.path.read_text()
    # a plain definition, or chapter 7's ATTN07_ENTRY(name, ...), a macro that writes one
    # (or ATTN07_PARTIAL_ENTRY); and the runner's helper entries
    entries = {e for D in (spec.head_dims or {64}) if spec.supports_head_dim(D) for e in spec.entries_at_head_dim(D)}
    for entry in entries | set(spec.helper_entries):
        macro = re.search(rf"^(ATTN07_\w*ENTRY)\({re.escape(entry)}, ", text, re.M)
        assert re.search(rf'extern "C"[^;{{]*\b{re.escape(entry)}\s*\(', text) or \
            (macro and re.search(rf'#define {macro.group(1)}\(NAME, [^)]*\)\s*\\\s*extern "C" __global__', text)), \
            f"{entry} is not an extern \"C\" function of {spec.source}"
    for header in spec.extra_sources:
        assert (spec.path.parent / header).exists()


GEOMETRY_SHAPES = CHECK_SHAPES + (Shape(4, 16, 4096, 64), Shape(2, 16, 4096, 128))


@pytest.mark.parametrize("spec,shape", [(k, s) for k in SPECS for s in GEOMETRY_SHAPES if k.supports_head_dim(s.D)],
                         ids=lambda x: x.label() if isinstance(x, Shape) else x.id)
def test_launch_block_and_shared_memory_are_launchable(spec, shape):
    cfg = spec.launch_config(shape)
    bx, by, bz = cfg["block"]
    assert 32 <= bx * by * bz <= 1024 and (bx * by * bz) % 32 == 0
    assert 0 <= cfg["dynamic_smem"] <= L4_MAX_SMEM_PER_BLOCK


ROW_LENGTHS = (1, 17, 64, 333, 512, 1000, 2048, 4096)


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.alternatives], ids=lambda s: s.id)
def test_launch_geometry_covers_every_row(spec):
    """Each (batch, head) is one grid row (times the key splits of FlashAttention-2's route), and
    along L the grid is ceil(L / R) CTAs for one tile of R query rows: every row of every length
    has exactly one CTA, none of them a CTA past the last tile. (A kernel that launches one of its
    alternatives per shape launches theirs: tests/test_kv_split.py.)"""
    for D in (d for d in (8, 16, 64, 128) if spec.supports_head_dim(d)):
        splits = [1] + sorted(spec.entries_by_split or ())
        for k in splits[:4] + splits[-1:]:
            grids = {L: (spec.at_split(Shape(2, 3, L, D), k)["grid"] if spec.at_split else spec.grid(Shape(2, 3, L, D)))
                     for L in ROW_LENGTHS}
            rows = -(-max(ROW_LENGTHS) // grids[max(ROW_LENGTHS)][0])  # R, from the longest length
            threads = math.prod(spec.block(Shape(2, 3, 4096, D)))
            # No kernel gives a CTA more query rows than threads (one row a thread at most, chapter 1's
            # count; a warp's 16-row MMA tiles, chapters 5-7, take fewer): a grid too small for L fails.
            assert rows <= threads, f"{spec.id} D={D} split={k}: {rows} rows per CTA of {threads} threads"
            for L, (gx, gy, gz) in grids.items():
                assert gx == -(-L // rows), f"{spec.id} D={D} split={k}: {gx} CTAs for L={L}, tiles of {rows} rows"
                assert gy == 2 * 3 and gz in (1, k), f"{spec.id} D={D} split={k}: grid {(gx, gy, gz)}"


def test_scalar_threads_match_the_kernel_source():
    src = registry.get("01_scalar").path.read_text()
    assert int(re.search(r"THREADS = (\d+);", src).group(1)) == registry.ch01_scalar.THREADS
    assert registry.get("01_scalar").grid(MISSION) == (512 // registry.ch01_scalar.THREADS, 8, 1)


def test_unknown_kernel_names_the_registered_ones():
    with pytest.raises(KeyError, match="01_scalar"):
        registry.get("99_missing")


def test_select_orders_by_chapter():
    chapters = [s.chapter for s in registry.select(None)]
    assert chapters == sorted(chapters)


def test_double_registration_is_refused():
    with pytest.raises(ValueError, match="twice"):
        registry.register(registry.get("01_scalar"))
