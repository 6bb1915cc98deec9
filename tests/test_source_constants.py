"""The registry's tile sizes come from the kernels' sources (attnlab.kernels.source_constants), so
each number is written once: in the .cu the compiler reads."""
from __future__ import annotations

import pytest

from attnlab.kernels import registry, source_constants
from attnlab.kernels.source_constants import _definitions, constant, constants
from attnlab.shapes import MISSION


def test_namespace_constants_knob_defaults_and_expressions():
    text = ("#ifdef ATTN_X_WARPS\nconstexpr int WARPS = ATTN_X_WARPS;\n#else\nconstexpr int WARPS = 4;  // four\n#endif\n"
            "constexpr int THREADS = WARPS * 32;\nconstexpr int HALF = THREADS / 3;\n#define STAGES 2\n"
            "template <int D>\nconstexpr int TILE = D == 64 ? 64 : 32;\n"
            "void f() {\n    constexpr int LOCAL = 7;\n}\n")
    assert _definitions(text, {}) == {"WARPS": 4, "THREADS": 128, "HALF": 42, "STAGES": 2}
    assert _definitions("constexpr int ROWS = TILE_M + 2;\n", {"TILE_M": 64}) == {"ROWS": 66}


def test_the_registry_reads_the_kernels_own_numbers():
    assert constants("02_block_tiling.cu")["Q_STRIDE"] == constants("02_block_tiling.cu")["ROWS"] + 2
    assert registry.ch02_block_tiling.Q_STRIDE == constant("02_block_tiling.cu", "Q_STRIDE")
    assert registry.ch07_mma.BLOCK_N == {64: constant("07_mma_swizzle.cu", "BLOCK_N_D64"),
                                         128: constant("07_mma_swizzle.cu", "BLOCK_N_D128")}
    assert registry.ch06_warp_specialized.BLOCK_N[128] == constant("06_warp_specialized.cu", "BLOCK_N_D128", "wmma_tile.cuh")
    assert registry.ch05_wmma.THREADS == 32 * constant("wmma_tile.cuh", "COMPUTE_WARPS")
    assert registry.ch06_warp_specialized.VARIANTS["06_ws_s3_p2"] == (3, 2)
    assert registry.ch07_mma.SPLIT_ENTRIES == {2: (64, 128), 4: (64, 128)}
    assert registry.get("07_mma_nosplit").grid(MISSION)[0] == MISSION.L // registry.ch07_mma.BLOCK_M


def test_a_constant_the_file_lacks_is_a_clear_error():
    with pytest.raises(KeyError, match="01_scalar.cu defines no integer constant ROWS"):
        constant("01_scalar.cu", "ROWS")
    assert source_constants.constants("01_scalar.cu")["THREADS"] == registry.ch01_scalar.THREADS


def test_macro_calls_name_each_entrys_arguments_by_the_macros_parameters():
    calls = source_constants.macro_calls("07_mma_swizzle.cu", "ATTN07_ENTRY")
    assert calls["attn_fwd_07_mma_plain_d128"] == {"D": "128", "BLOCK_N": "BLOCK_N_D128", "KV_SPLIT": "1",
                                                   "SWIZZLE": "false", "STAGES": "1", "ONE_BARRIER": "false",
                                                   "LONGEST_FIRST": "false", "ROW_BLOCKS": "1", "ACROSS_HEADS": "false",
                                                   "WHOLE_TILES": "false", "SKIP_RESCALE": "false",
                                                   "DEFER_PV": "false"}
    assert len(calls) == (registry.get("07_mma").path.read_text().count("\nATTN07_ENTRY(attn_fwd"))
