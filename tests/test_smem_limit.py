"""The shared-memory limit per block is the GPU at hand's (227 KB on an H100), and the L4's 99 KB
without a GPU: checked on a CPU with torch's device properties faked."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import attnlab.env
from attnlab import gpus
from attnlab.kernels import registry
from attnlab.gpu import search
from attnlab.kernels.registry import L4_MAX_SMEM_PER_BLOCK
from attnlab.shapes import Shape

H100_OPTIN = 227 * 1024
OVER_L4 = ("05_wmma", {"ATTN_WMMA_BLOCK_M": 64, "ATTN05_BLOCK_N": 128}, 64)     # 105472 B
OVER_H100 = ("05_wmma", {"ATTN_WMMA_BLOCK_M": 128, "ATTN05_BLOCK_N": 128}, 128)  # 239616 B


def _problems(case) -> list[str]:
    kernel_id, config, D = case
    return registry.get(kernel_id).with_config(config).config_problems(D)


def _dynamic_smem(case) -> int:
    kernel_id, config, D = case
    return registry.get(kernel_id).with_config(config).dynamic_smem(Shape(1, 1, 1, D))


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: False)


def fake_gpu(monkeypatch, name: str, **props):
    """torch sees one GPU named `name` with these device properties."""
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(name=name, **props))


@pytest.fixture
def h100(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", shared_memory_per_block_optin=H100_OPTIN)


def test_the_cases_sit_where_the_tests_say():
    assert L4_MAX_SMEM_PER_BLOCK < _dynamic_smem(OVER_L4) <= H100_OPTIN < _dynamic_smem(OVER_H100)


def test_without_a_gpu_the_limit_is_the_l4s(no_gpu):
    assert gpus.max_smem_per_block() == (99 * 1024, "the L4's")
    (problem,) = _problems(OVER_L4)
    assert problem == f"{_dynamic_smem(OVER_L4)} B of shared memory at D=64, over the L4's 101376 B per block"
    assert OVER_L4[1] not in search.valid_space("05_wmma", 64)


def test_on_an_h100_the_limit_is_its_own(h100):
    assert gpus.max_smem_per_block() == (H100_OPTIN, "the NVIDIA H100 80GB HBM3's")
    assert _problems(OVER_L4) == []
    assert OVER_L4[1] in search.valid_space("05_wmma", 64)
    (problem,) = _problems(OVER_H100)
    assert problem.endswith(f"over the NVIDIA H100 80GB HBM3's {H100_OPTIN} B per block")


def test_a_smaller_gpu_refuses_what_the_l4_takes(monkeypatch):
    kernel_id, config, D = "05_wmma", {"ATTN_WMMA_BLOCK_M": 64, "ATTN05_BLOCK_N": 64}, 128  # 95232 B
    spec = registry.get(kernel_id).with_config(config)
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: False)
    assert spec.config_problems(D) == []
    fake_gpu(monkeypatch, "Small GPU", shared_memory_per_block_optin=64 * 1024)
    (problem,) = spec.config_problems(D)
    assert "over the Small GPU's 65536 B per block" in problem


def test_a_torch_without_the_field_reads_the_gpu_table(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB")
    assert gpus.max_smem_per_block() == (163 * 1024, "the NVIDIA A100-SXM4-80GB's")
    fake_gpu(monkeypatch, "Some Unknown GPU")
    assert gpus.max_smem_per_block() == (L4_MAX_SMEM_PER_BLOCK, "the Some Unknown GPU's")


def _gate_with_ptxas(monkeypatch, static_smem: int):
    """static_gate on a configuration under both limits by its dynamic shared memory alone (95232 B
    at D=128), with ptxas reporting `static_smem` bytes of static shared memory for its entry."""
    config, D = {"ATTN_WMMA_BLOCK_M": 64, "ATTN05_BLOCK_N": 64}, 128
    entry = registry.get("05_wmma").with_config(config).entry_for(D)
    monkeypatch.setattr(search.toolchain, "has_nvcc", lambda: True)
    monkeypatch.setattr(search, "_ptxas_functions", lambda spec, arch: [dict(
        name=entry, registers=96, static_smem=static_smem, spill_stores=0, spill_loads=0, stack_bytes=0)])
    return search.static_gate("05_wmma", config, D)


def test_static_gate_refuses_over_the_l4s_limit_without_a_gpu(no_gpu, monkeypatch):
    verdict = _gate_with_ptxas(monkeypatch, static_smem=8192)
    assert verdict.compiled and verdict.smem == 95232 + 8192
    assert verdict.problems == [f"{95232 + 8192} B of shared memory, over the L4's 101376 B per block"]


def test_static_gate_takes_it_on_an_h100(h100, monkeypatch):
    verdict = _gate_with_ptxas(monkeypatch, static_smem=8192)
    assert verdict.compiled and verdict.problems == []
    verdict = _gate_with_ptxas(monkeypatch, static_smem=H100_OPTIN)
    # the gate judges the build's architecture, the H100's sm_90
    assert verdict.arch == "sm_90"
    assert verdict.problems == [f"{95232 + H100_OPTIN} B of shared memory, over an sm_90 GPU's {H100_OPTIN} B per block"]
