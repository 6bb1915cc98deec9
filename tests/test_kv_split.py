"""Chapter 7's key split: the launcher's choice (FlashAttention-2's rule over the SMs of the GPU at
hand) and what each choice launches. The splits' correctness is the CPU suite's and the model's
(tests/test_executor_kernels.py, tests/test_model_07.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import attnlab.env
from attnlab import gpus, registry
from attnlab.registry import choose_kv_split
from attnlab.shapes import MISSION, Shape

SPEC = registry.get("07_mma")


def on_gpu(monkeypatch, name: str, sms: int):
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(name=name, multi_processor_count=sms))


def test_the_rule_is_flashattention2s():
    ctas = lambda s: 64 * s  # noqa: E731 - the mission shape's grid: 64 CTAs unsplit
    assert choose_kv_split(ctas, (1, 2, 4), 58) == 1     # 64 >= 0.8 x 58: an L4 is already full
    assert choose_kv_split(ctas, (1, 2, 4), 132) == 2    # 128 / 132 = 0.97 of a wave; 4 is no better
    assert choose_kv_split(ctas, (1, 2, 4), 300) == 4    # 256 / 300 = 0.85 against 128 / 300 = 0.43
    assert choose_kv_split(ctas, (1, 2), 300) == 2       # only the splits the build has
    assert choose_kv_split(lambda s: 3, (1, 2, 4), 132) == 1  # a split that adds no CTA is not taken
    with pytest.raises(ValueError):
        choose_kv_split(ctas, (2, 4), 132)


def test_without_a_gpu_the_launcher_sizes_for_the_l4(monkeypatch):
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: False)
    assert gpus.sm_count() == (58, "the L4's")
    assert SPEC.launch_config(MISSION) == {"grid": (8, 8, 1), "block": (128, 1, 1), "dynamic_smem": 40960,
                                           "entry": "attn_fwd_07_mma_d64", "kv_split": 1}


def test_on_an_h100_the_mission_shape_splits_the_keys_in_two(monkeypatch):
    on_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 132)
    assert gpus.sm_count() == (132, "the NVIDIA H100 80GB HBM3's")
    for causal_shape in (MISSION, MISSION._replace(D=128)):
        cfg = SPEC.launch_config(causal_shape)
        assert cfg["kv_split"] == 2 and cfg["grid"] == (16, 8, 1) and cfg["block"] == (128, 1, 1)
        assert cfg["entry"] == f"attn_fwd_07_mma_split2_d{causal_shape.D}"
    # the large target shapes fill any GPU without a split
    for shape in (Shape(4, 16, 4096, 64), Shape(2, 16, 4096, 128)):
        assert SPEC.launch_config(shape)["kv_split"] == 1
    # the ablation never splits; the fixed-split variants always do
    assert registry.get("07_mma_nosplit").launch_config(MISSION)["grid"] == (8, 8, 1)
    assert registry.get("07_mma_split4").launch_config(Shape(4, 16, 4096, 64))["kv_split"] == 4


def test_a_split_the_head_dim_cannot_take_is_never_chosen(monkeypatch):
    on_gpu(monkeypatch, "a GPU with many SMs", 1000)
    assert SPEC.kv_split(Shape(1, 1, 512, 64)) == 4
    assert SPEC.kv_split(Shape(1, 1, 512, 128)) == 2   # 32-key tiles: a split of 4 leaves 8-key slices
    assert not registry.get("07_mma_split4").supports_head_dim(128)
