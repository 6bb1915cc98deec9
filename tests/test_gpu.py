"""On a GPU: the correctness suite on every registered kernel, and a quick timing run.
Without a GPU these are skipped (and say so); `python -m attnlab check` is the same suite."""
import pytest

from attnlab.kernels.registry import select
from attnlab.shapes import MISSION


@pytest.mark.gpu
@pytest.mark.parametrize("spec", select(None), ids=lambda s: s.id)
def test_check_suite(spec):
    from attnlab.gpu.check import format_table, run_suite

    results = run_suite([spec], progress=False)
    assert results, f"no cases for {spec.id}"
    assert all(r.passed for r in results), format_table(results)


@pytest.mark.gpu
def test_quick_bench_makes_a_valid_record():
    from attnlab.gpu.bench import run_bench
    from attnlab.records.results import seal, validate_record

    rec = run_bench(select(["01_scalar"]), [MISSION], quick=True, progress=False)
    assert validate_record(seal(rec)) == []  # sealed as write_record seals it
    entry = rec["cases"][0]["kernels"]["01_scalar"]
    assert entry["check"]["passed"] and entry["device"]["median_us"] > 0
    assert rec["cases"][0]["sdpa"], "no SDPA backend ran"


@pytest.mark.gpu
def test_launch_on_a_side_stream_is_ordered():
    import torch

    from attnlab import attention
    from attnlab.pass_rule import make_inputs
    from attnlab.reference import reference_attention

    q, k, v = make_inputs(MISSION, seed=0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # q, k, v were made on the current stream
    with torch.cuda.stream(s):
        out = attention("01_scalar", q, k, v)
    torch.cuda.current_stream().wait_stream(s)  # out is read below, on the current stream
    assert float((out.double() - reference_attention(q, k, v)).abs().max()) < 5e-3
