"""The CPU suite's plumbing (attnlab.executor.cpu) that `check --cpu` stands on: which shapes a kernel runs,
and how a case and its findings name the kernel and the target whose tiles it was built with."""
from __future__ import annotations

import pytest
import torch

from attnlab.executor import cpu
from attnlab.kernels import registry
from attnlab.executor.library import Finding, LaunchReport
from attnlab.gpus import arch_at_hand
from attnlab.shapes import Shape


def test_a_kernel_whose_tiles_follow_the_target_is_named_with_it():
    assert cpu.cpu_label(registry.get("07_mma", "sm_90"), "sm_90") == "07_mma@sm_90"
    assert cpu.cpu_label(registry.get("07_mma", "sm_90")) == "07_mma@sm_90"  # the build's own target
    assert cpu.cpu_label(registry.get("07_mma", "sm_89"), "sm_89") == "07_mma@sm_89"
    assert cpu.cpu_label(registry.KERNELS["07_mma"]) == f"07_mma@{arch_at_hand()[0]}"  # the source's: at hand
    assert cpu.cpu_label(registry.get("01_scalar"), "sm_90") == "01_scalar"  # the same tiles everywhere
    assert registry.by_label(cpu.cpu_label(registry.get("07_mma", "sm_90"))).config == registry.get("07_mma", "sm_90").config


def test_a_case_and_its_findings_carry_the_label(monkeypatch):
    """A finding says which build made it: chapter 7 with the H100's tiles is not the L4's."""
    spec = registry.get("07_mma", "sm_90")
    race = Finding("race", "write after read", (0, 0, 0), 1, 3, "07_mma_swizzle.cu:270")

    def attention_cpu(spec, q, k, v, causal, **options):
        return torch.full_like(q, float("nan")), LaunchReport(completed=True, findings=[race])
    monkeypatch.setattr(cpu, "attention_cpu", attention_cpu)
    case = cpu.check_case_cpu(spec, Shape(1, 1, 17, 64), False, 0, label="07_mma@sm_90")
    assert case.kernel == "07_mma@sm_90" and not case.passed
    assert case.findings == [race.line("07_mma@sm_90")] and case.findings[0].startswith("07_mma@sm_90: race: ")
    table = cpu.format_table_cpu([case])
    assert "07_mma@sm_90: race: write after read" in table
    assert cpu.check_case_cpu(spec, Shape(1, 1, 17, 64), False, 0).kernel == "07_mma"  # no label: the id


def test_the_suite_leaves_out_what_a_kernel_cannot_take_and_names_each_case(monkeypatch):
    ran = []

    def check_case_cpu(spec, shape, causal, seed, label=None):
        ran.append((label, shape, causal, seed))
        return label
    monkeypatch.setattr(cpu, "check_case_cpu", check_case_cpu)
    specs = [registry.get("07_mma", "sm_90"), registry.get("01_scalar")]
    shapes = [Shape(1, 1, 5, 96), Shape(1, 1, 5, 64), Shape(70000, 1, 5, 64)]
    cpu.run_suite_cpu(specs, shapes=shapes, seeds=(0, 1), progress=False, labels=["07_mma@sm_90", "01_scalar"])
    assert {(label, shape.D) for label, shape, _, _ in ran} == {("07_mma@sm_90", 64), ("01_scalar", 64),
                                                                ("01_scalar", 96)}
    assert all(shape.heads < 65536 for _, shape, _, _ in ran)  # past the grid's y limit: no kernel's
    assert len(ran) == 3 * 2 * 2  # three (kernel, shape) pairs, causal and not, two seeds
    with pytest.raises(ValueError, match="1 labels for 2 kernels"):
        cpu.run_suite_cpu(specs, shapes=shapes, progress=False, labels=["07_mma"])


def test_the_default_cpu_list_reaches_past_the_row_softmax_step():
    """`check --cpu 04_cublas_hybrid` (cpu_shapes) runs rows longer than one and two 256-column steps."""
    lengths = {s.L for s in cpu.cpu_shapes(registry.get("04_cublas_hybrid"))}
    assert {300, 513, 520} <= lengths and max(cpu.CPU_LENGTHS) < 256
    assert max(s.L for s in cpu.cpu_shapes(registry.get("01_scalar"))) == max(cpu.CPU_LENGTHS)


def test_the_table_keeps_long_labels_apart_from_the_shape():
    case = cpu.CpuCase("07_mma_single_buffer@sm_90", (1, 2, 17, 128), False, 0, True, 1e-4, 1e-3, 1e-4, 1e-4)
    header, row, _ = cpu.format_table_cpu([case]).splitlines()
    assert row.split()[:2] == ["07_mma_single_buffer@sm_90", "(1,"]
    assert header.index("shape") == row.index("(1, 2, 17, 128)")
