"""Chapter 4's cost model (attnlab.book.hybrid_model): every row priced where its bytes live, and one
prediction against SDPA's math backend that chapters 4 and 9 both quote."""
import pytest

from attnlab.gpu import hybrid
from attnlab.book import hybrid_model as model
from attnlab.gpus import by_key
from attnlab.shapes import MISSION, Shape

L4 = by_key("L4")


def test_a_row_whose_scores_fit_in_l2_is_priced_at_l2_bandwidth():
    fits = MISSION                                   # 4 MiB of scores
    spills = MISSION._replace(L=4096)               # 256 MiB
    assert model.hybrid_footprint(fits) <= model.L4_L2_BYTES < model.hybrid_footprint(spills)
    h = model.predict_hybrid(fits)
    assert (h.level, h.gbps) == ("L2", model.L4_L2_GBPS)
    assert h.us == pytest.approx(model.hybrid_bytes(fits) / (model.L4_L2_GBPS * 1e9) * 1e6)
    h = model.predict_hybrid(spills)
    assert (h.level, h.gbps) == ("DRAM", L4.dram_gbps)
    assert h.us == pytest.approx(model.hybrid_bytes(spills) / (L4.dram_gbps * 1e9) * 1e6)


def test_the_hybrids_bytes_are_five_passes_over_s_four_with_the_mask():
    s = Shape(1, 2, 300, 64)
    assert model.hybrid_bytes(s) == 5 * hybrid.score_bytes(s) + s.io_bytes()
    assert model.hybrid_bytes(s, causal=True) == 4 * hybrid.score_bytes(s) + s.io_bytes()


def test_the_l2_estimate_is_the_lower_of_its_two_scalings_and_above_dram():
    assert model.L4_L2_GBPS == min(model.L4_L2_GBPS_BY_SMS, model.L4_L2_GBPS_BY_BUS)
    assert L4.dram_gbps < model.L4_L2_GBPS < model.L40_L2_GBPS_MEASURED


def test_the_math_backends_scores_leave_l2_before_the_hybrids():
    """fp32 S and P (out of place) take 8 bytes per score against the hybrid's 2."""
    s = MISSION._replace(L=1024)
    assert model.predict_hybrid(s).level == "L2" and model.predict_math(s, False, False).level == "DRAM"
    assert model.predict_math(s, True, False).level == "L2"


@pytest.mark.parametrize("L", [128, 512, 2048, 32768])
def test_the_prediction_follows_the_math_backends_precision(L):
    """An fp32 math backend moves more than twice the hybrid's bytes: the hybrid is predicted
    faster at every length; one with fp16 scores makes one pass fewer: the hybrid trails it."""
    s = MISSION._replace(L=L)
    assert model.hybrid_over_math(s, fp16_reduction=False, tf32=False) < 0.6
    assert 1.0 < model.hybrid_over_math(s, fp16_reduction=True, tf32=False) < 1.3


def test_a_pytorch_without_the_switch_keeps_fp16_scores(monkeypatch):
    import torch

    monkeypatch.delattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", raising=False)
    assert model.math_backend_config()[0] is True


def test_chapters_4_and_9_quote_one_prediction():
    """Chapter 9 states chapter 4's prediction through the same call, not a sentence of its own."""
    import nbformat

    from attnlab.paths import repo_root

    def code(name):
        nb = nbformat.read(repo_root() / "book" / f"{name}.ipynb", as_version=4)
        return "\n".join(c.source for c in nb.cells if c.cell_type == "code")

    assert "model.hybrid_over_math(MISSION, fp16_math, tf32)" in code("ch04_cublas_hybrid")
    assert "hybrid_model.hybrid_over_math(MISSION, fp16_math, tf32)" in code("ch09_scoreboard")
