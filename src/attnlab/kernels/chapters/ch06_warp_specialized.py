"""Chapter 6 (kernels/06_warp_specialized.cu): producer warps fill a cp.async ring for WMMA
consumers, and its sweep variants (kernels/06_ws_s<stages>_p<producers>.cu)."""
from __future__ import annotations

import re

from ...paths import kernels_dir
from ..spec import KernelSpec, Knob, Tuning, cdiv, register
from ..source_constants import constants
from .ch05_wmma import BLOCK_M_KNOB, WARP_M, wmma_smem

SOURCE = "06_warp_specialized.cu"
_C = constants(SOURCE, "wmma_tile.cuh")
BLOCK_N = {64: _C["BLOCK_N_D64"], 128: _C["BLOCK_N_D128"]}  # keys per tile


def _variants() -> dict[str, tuple[int, int]]:
    """(stages, producer warps) by registry id: the chapter's kernel (its #define defaults), then
    each sweep variant, from the dispatch<STAGES, PRODUCERS> its own file calls."""
    out = {"06_warp_specialized": (_C["ATTN06_STAGES"], _C["ATTN06_PRODUCERS"])}
    for path in sorted(kernels_dir().glob("06_ws_s*_p*.cu")):
        stages, producers = re.search(r"dispatch<(\d+), (\d+)>", path.read_text()).groups()
        out[path.stem] = (int(stages), int(producers))
    return out


VARIANTS = _variants()


def geometry(config: dict) -> dict:
    bm, stages, producers = config["ATTN_WMMA_BLOCK_M"], config["ATTN06_STAGES"], config["ATTN06_PRODUCERS"]
    bn = {64: config["ATTN06_BLOCK_N_D64"], 128: config["ATTN06_BLOCK_N_D128"]}
    return {"block": lambda s: (32 * (bm // WARP_M + producers), 1, 1),
            "grid": lambda s: (cdiv(s.L, bm), s.B * s.H, 1),
            "dynamic_smem": lambda s: wmma_smem(s.D, bn.get(s.D, 32), 2 * stages, bm)}


def rules(config: dict, D: int) -> list[str]:
    # Named barriers 1..2*STAGES (FULL and EMPTY per stage); the hardware has ids 0..15.
    if 2 * config["ATTN06_STAGES"] > 15:
        return [f"{config['ATTN06_STAGES']} stages need {2 * config['ATTN06_STAGES']} named barriers; ids 1..15 exist"]
    return []


TUNING = Tuning(
    knobs=(BLOCK_M_KNOB,
           Knob("ATTN06_BLOCK_N_D64", (32, 64, 128), BLOCK_N[64], "keys per tile (D=64)", head_dim=64),
           Knob("ATTN06_BLOCK_N_D128", (16, 32, 64), BLOCK_N[128], "keys per tile (D=128)", head_dim=128),
           Knob("ATTN06_STAGES", (1, 2, 3, 4), VARIANTS["06_warp_specialized"][0], "ring stages"),
           Knob("ATTN06_PRODUCERS", (1, 2), VARIANTS["06_warp_specialized"][1], "producer warps")),
    geometry=geometry, rules=rules)

for _id, (_stages, _producers) in VARIANTS.items():
    _default = _id == "06_warp_specialized"
    register(KernelSpec(
        id=_id,
        chapter=6,
        title="Warp specialization" + ("" if _default else f" ({_stages} stg, {_producers} prod)"),
        source=SOURCE if _default else f"{_id}.cu",
        entry="attn_fwd_06_warp_specialized" if _default else f"attn_fwd_{_id}",
        # The sweep variants fix stages and producers in their own entry; only the chapter's kernel
        # takes chapter 8's knobs.
        **geometry({**TUNING.defaults, "ATTN06_STAGES": _stages, "ATTN06_PRODUCERS": _producers}),
        tuning=TUNING if _default else None,
        head_dims=frozenset({64, 128}),
        alignment=16,
        extra_sources=("common.cuh", "ptx.cuh", "wmma_tile.cuh") + (() if _default else (SOURCE,)),
        summary=("a producer warp cp.asyncs K/V into a 2-stage ring for 4 WMMA consumer warps; "
                 "named-barrier hand-off" if _default else
                 f"sweep variant of 06_warp_specialized: {_stages} stage{'s' * (_stages > 1)}, "
                 f"{_producers} producer warp{'s' * (_producers > 1)}"),
        variant_of=None if _default else "06_warp_specialized",
    ))
