"""The static build of every registered kernel for sm_80, sm_89 and sm_90: no GPU needed."""
import pytest

from attnlab.kernels.registry import KERNELS, L4_MAX_SMEM_PER_BLOCK, get
from attnlab.kernels.static import (ARCHES, FunctionResources, StaticReport, classify, inspect_kernel, limit_problems,
                                    parse_ptxas)

PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k1' for 'sm_89'
ptxas info    : Function properties for k1
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 32768 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k2' for 'sm_89'
ptxas info    : Function properties for k2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 400 bytes cmem[0]
"""


def test_parse_ptxas_report():
    k1, k2 = parse_ptxas(PTXAS)
    assert (k1.name, k1.registers, k1.static_smem, k1.stack_bytes, k1.spill_stores, k1.spill_loads) == \
        ("k1", 255, 32768, 16, 8, 4)
    assert k1.spills and not k2.spills and k2.static_smem == 0


def test_limits_flag_spills_and_smem():
    spec = next(iter(KERNELS.values()))
    rep = StaticReport(spec.id, "sm_89", [FunctionResources(spec.entry, 255, 60 * 1024, 8, 8, 8, 50 * 1024)], {},
                       build_seconds=0)
    problems = limit_problems(rep)
    assert any("spills" in p for p in problems)
    assert any(str(L4_MAX_SMEM_PER_BLOCK) in p for p in problems)


def test_classify_sass():
    cls = classify({"HMMA.16816.F32": 8, "LDGSTS.E.BYPASS.128": 4, "FFMA": 10, "SHFL.BFLY": 2, "NOP": 3})
    assert cls["tensor core"] == 8 and cls["async copy"] == 4 and cls["fp32 math"] == 10
    assert cls["shuffle"] == 2 and cls["other"] == 3


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("kernel_id", sorted(KERNELS))
def test_builds_without_spill_within_l4_smem(kernel_id, arch):
    rep = inspect_kernel(get(kernel_id, arch), arch)
    assert rep.ok, rep.problems
    assert sum(rep.sass.values()) > 0
    assert rep.sass_by_class()["local (spill)"] == 0


def test_scalar_kernel_runs_on_cuda_cores():
    rep = inspect_kernel(KERNELS["01_scalar"], "sm_89")
    cls = rep.sass_by_class()
    assert cls["tensor core"] == 0 and cls["fp32 math"] > 0 and cls["global load"] > 0


def test_each_function_carries_the_shared_memory_of_its_own_launch():
    """Chapter 7's double-buffered D = 64 entry is launched with the dynamic shared memory the
    launcher gives it at the mission shape, not the largest of the file's entries."""
    from attnlab.shapes import MISSION

    spec = get("07_mma", "sm_89")
    rep = inspect_kernel(spec, "sm_89")
    fn = {f.name: f for f in rep.functions}
    assert fn["attn_fwd_07_mma_d64"].dynamic_smem == spec.at_split(MISSION, 1)["dynamic_smem"]
    assert fn["attn_fwd_07_mma_d64"].dynamic_smem < fn["attn_fwd_07_mma_d128"].dynamic_smem


def test_helpers_are_listed_with_the_id_that_launches_them():
    rep = inspect_kernel(get("07_mma_split_ctas", "sm_89"), "sm_89")
    fn = {f.name: f for f in rep.functions}
    assert fn["attn_combine_07"].dynamic_smem == 0
    assert not any("single_buffer" in name or "split2" in name for name in fn), sorted(fn)


def test_sass_counts_only_the_ids_functions():
    whole = inspect_kernel(get("07_mma", "sm_89"), "sm_89")
    single = inspect_kernel(get("07_mma_single_buffer", "sm_89"), "sm_89")
    assert sum(single.sass.values()) < sum(whole.sass.values())


def test_barrier_class_counts_only_block_barriers():
    """BAR.SYNC and BAR.ARV synchronize warps of a block; BSSY, BSYNC, BREAK and WARPSYNC only
    reconverge one warp and are a class of their own."""
    cls = classify({"BAR.SYNC.DEFER_BLOCKING": 1, "BAR.ARV": 2, "BSSY": 67, "BSYNC": 67, "BREAK": 1,
                    "WARPSYNC.ALL": 1, "WARPSYNC": 2, "HFMA2.MMA": 4, "HADD2.F32": 5, "ISETP.GE.AND": 7,
                    "BRA": 9})
    assert cls["barrier"] == 3 and cls["convergence"] == 138
    assert cls["integer & address"] == 4 + 7 and cls["conversion"] == 5 and cls["fp16 math"] == 0
    assert cls["control flow"] == 9 and cls["other"] == 0


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("kernel_id, bars", [("02_block_tiling", 2), ("03_warp_rows_4w", 1), ("03_warp_rows_8w", 1),
                                             ("04_cublas_hybrid", 0), ("05_wmma", 4)])
def test_barrier_class_is_the_bar_sync_count_the_chapters_quote(kernel_id, bars, arch):
    """Chapter 3's one BAR.SYNC per entry point (chapter 2's two, chapter 5's four) is the barrier
    count of every table: the class, the opcode count and kernel_view's count agree."""
    from attnlab.book.kernel_view import count_ops

    rep = inspect_kernel(get(kernel_id, arch), arch)
    assert rep.sass_by_class()["barrier"] == count_ops(rep.sass, "BAR") == bars
