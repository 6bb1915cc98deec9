"""A page executed in a GPU session's book stage (ATTNLAB_REUSE_RECORDS=1) takes the check and bench
records this GPU wrote minutes earlier instead of measuring again, and measures live otherwise."""
from __future__ import annotations

import copy

import pytest
from synthetic import synthetic_record

from attnlab.book import page
from attnlab.records.results import write_record
from attnlab.shapes import MISSION

GPU = "TEST GPU (NVIDIA L4 table entry)"


@pytest.fixture
def on_a_gpu(results, monkeypatch):
    monkeypatch.setenv("ATTNLAB_REUSE_RECORDS", "1")
    monkeypatch.setattr(page, "has_gpu", lambda: True)
    monkeypatch.setattr(page, "device_name", lambda: GPU)

    def no_live_run(*args, **kwargs):
        raise AssertionError("measured live although a fresh record of this GPU exists")
    monkeypatch.setattr("attnlab.gpu.bench.run_bench", no_live_run)
    monkeypatch.setattr("attnlab.gpu.check.run_suite", no_live_run)
    return results


def _two_kernel_record():
    rec = synthetic_record(gpu=GPU)
    other = synthetic_record(gpu=GPU, kernel="02_block_tiling")
    rec["kernels"].update(other["kernels"])
    for case, extra in zip(rec["cases"], other["cases"]):
        case["kernels"].update(extra["kernels"])
    return rec


def test_bench_takes_this_gpus_record_reduced_to_the_pages_kernels(on_a_gpu):
    write_record(_two_kernel_record(), on_a_gpu)
    rec = page._measure_now(["01_scalar"], [MISSION], quick=False, save=True)
    assert set(rec["kernels"]) == {"01_scalar"}
    assert all(set(c["kernels"]) == {"01_scalar"} for c in rec["cases"])


def test_another_gpus_record_or_a_missing_shape_means_measuring(on_a_gpu):
    write_record(synthetic_record(gpu="ANOTHER GPU"), on_a_gpu)
    assert page.reusable_bench(["01_scalar"], [MISSION]) is None
    write_record(synthetic_record(gpu=GPU, created="2026-01-02T00:00:00Z"), on_a_gpu)
    assert page.reusable_bench(["01_scalar"], [MISSION]) is not None
    assert page.reusable_bench(["01_scalar"], [MISSION._replace(L=4096)]) is None
    assert page.reusable_bench(["01_scalar", "02_block_tiling"], [MISSION]) is None
    with pytest.raises(AssertionError, match="measured live"):
        page._measure_now(["01_scalar"], [MISSION._replace(L=4096)], quick=False, save=False)


def test_check_takes_a_record_with_every_seed_asked(on_a_gpu, capsys):
    rec = copy.deepcopy(synthetic_record(gpu=GPU))
    rec["kind"] = "check"
    rec["cases"] = [{"kernel": "01_scalar", "shape": [1, 8, 512, 64], "causal": c, "seed": s, "passed": True,
                     "max_err": 1e-4, "fp16_err": 1e-4, "tolerance": 3e-4, "sdpa_err": 1e-4, "reason": ""}
                    for c in (False, True) for s in (0, 1, 2)]
    write_record(rec, on_a_gpu)
    results = page.check("01_scalar", quick=False)
    assert len(results) == 6 and "Checked on this GPU in this session" in capsys.readouterr().out
    assert page.reusable_check("01_scalar", (0, 1, 2, 3)) is None  # a seed it did not run: measure


def test_a_record_covers_a_kernel_its_run_could_not_give_the_shape():
    """Chapter 7's targets in one run: a kernel the run skipped at a shape (its GPU gives the
    64-key split no D = 128) still leaves the record covering the page; a kernel the run left out,
    or gave no check, does not."""
    from attnlab.shapes import Shape

    def record(split4):
        kernels = {"07_mma": {"check": {"passed": True}}}
        if split4 is not None:
            kernels["07_mma_split4"] = split4
        return {"cases": [{"shape": [2, 16, 4096, 128], "causal": c, "kernels": dict(kernels)} for c in (False, True)]}

    ids, shapes = ["07_mma", "07_mma_split4"], [Shape(2, 16, 4096, 128)]
    assert page.covers(record({"skipped": "07_mma_split4 supports head dim D in 64; got D=128"}), ids, shapes, "check")
    assert page.covers(record({"check": {"passed": True}}), ids, shapes, "check")
    assert not page.covers(record(None), ids, shapes, "check")
    assert not page.covers(record({"launch": {}}), ids, shapes, "check")
