"""On a GPU: chapters 8, 9 and appendix A's machinery on the device. Configured kernels pass the
check, a small search writes a valid record, the Triton reference passes the rule, the tuned
launcher runs, and ncu (where present and allowed) captures both launches of a kernel. Without a
GPU these are skipped, saying so."""
from __future__ import annotations

import pytest

from attnlab.kernels import registry
from attnlab.gpu import search
from attnlab.shapes import MISSION, Shape


def _some_configs(kernel_id: str, D: int, arch: str, n: int = 3) -> list[dict]:
    passing = [c for c in search.valid_space(kernel_id, D) if search.static_gate(kernel_id, c, D, arch).ok]
    picks = [passing[0], passing[len(passing) // 2], passing[-1]] if len(passing) >= 3 else passing
    return [dict(t) for t in dict.fromkeys(tuple(sorted(c.items())) for c in picks)][:n]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_id", search.searchable())
@pytest.mark.parametrize("D", (64, 128))
def test_configured_kernels_pass_the_check(kernel_id, D):
    import torch

    from attnlab.pass_rule import judge, make_inputs
    from attnlab.kernels.contract import validate
    from attnlab.gpu.launch import launch
    from attnlab.reference import naive_fp16, reference_attention

    arch = search._device_arch()
    for config in _some_configs(kernel_id, D, arch):
        spec = registry.get(kernel_id).with_config(config)
        for shape in (Shape(1, 2, 333, D), Shape(2, 1, 64, D), Shape(1, 1, 1, D)):
            q, k, v = make_inputs(shape, seed=2)
            for causal in (False, True):
                validate(spec, q, k, v, causal)
                ref = reference_attention(q, k, v, causal)
                fp16 = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
                out = torch.full_like(q, float("nan"))
                launch(spec, shape, q, k, v, out, causal, D ** -0.5)
                torch.cuda.synchronize()
                verdict = judge(out, ref, fp16)
                assert verdict.passed, (kernel_id, config, shape, causal, verdict)


@pytest.mark.gpu
def test_a_small_search_writes_a_valid_record():
    from attnlab.records.results import seal, validate_record

    rec = search.run_search("07_mma", MISSION, False, strategy="evolve", budget_s=60, population=4,
                            generations=2, reps=5, progress=False)
    assert validate_record(seal(rec)) == []  # sealed as write_record seals it
    assert rec["search"]["best"] is not None and rec["search"]["default"]["status"] == "ok"
    assert all(c["check"]["passed"] for c in rec["cases"] if c["status"] == "ok")


@pytest.mark.gpu
def test_triton_reference_passes_on_the_gpu():
    import torch

    from attnlab.gpu import triton_ref
    from attnlab.pass_rule import judge, make_inputs
    from attnlab.reference import naive_fp16, reference_attention

    if triton_ref.available() is not None:
        pytest.skip(triton_ref.available())
    for shape in (MISSION, Shape(1, 2, 333, 128), Shape(2, 3, 1000, 64)):
        q, k, v = make_inputs(shape, seed=0)
        for causal in (False, True):
            ref = reference_attention(q, k, v, causal)
            fp16 = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
            out = torch.full_like(q, float("nan"))
            triton_ref.attention(q, k, v, causal, out=out)
            assert judge(out, ref, fp16).passed, (shape, causal)


@pytest.mark.gpu
def test_tuned_launcher_runs_the_searched_configuration(monkeypatch, results):
    """With a search record of this GPU naming a configuration other than the chapter's, the tuned
    launcher runs that configuration, and its output passes the check."""
    from test_search import _search_record

    from attnlab import attention
    from attnlab.gpu import tuned
    from attnlab.env import device_name
    from attnlab.pass_rule import judge, make_inputs
    from attnlab.reference import naive_fp16, reference_attention
    from attnlab.records.results import write_record

    import torch

    # The record names this GPU as it is (an L4's 8.9 and 58 SMs on an H100 judge it stale)
    props = torch.cuda.get_device_properties(0)
    rec, fast = _search_record(monkeypatch, causal=True, gpu=device_name(), cc=f"{props.major}.{props.minor}",
                               sms=props.multi_processor_count)
    write_record(rec)
    spec, why = tuned.spec_for("07_mma", MISSION, True)
    default = registry.get("07_mma")
    assert spec.config != default.config and spec.config == {**default.config, **fast}, why
    q, k, v = make_inputs(MISSION, seed=0)
    ref = reference_attention(q, k, v, True)
    a = tuned.attention("07_mma", q, k, v, causal=True)
    verdict = judge(a, ref, float((naive_fp16(q, k, v, True).double() - ref).abs().max()))
    assert verdict.passed, verdict.reason
    b = attention("07_mma", q, k, v, causal=True)
    assert float((a.double() - b.double()).abs().max()) < 1e-2


@pytest.mark.gpu
def test_ncu_captures_both_launches():
    from attnlab.gpu import profile

    if profile.ncu_path() is None:
        pytest.skip("ncu is not installed")
    try:
        cases = profile.profile_kernel("07_mma", timeout=600)
    except profile.ProfileError as exc:
        if "ERR_NVGPUCTRPERM" in str(exc):
            pytest.skip(str(exc))
        raise
    assert [c["causal"] for c in cases] == [False, True]
    # At the mission shape a GPU with many SMs may run the key-split entry (07_mma's launcher picks it
    # when the grid is small): either is 07_mma's kernel at D = 64.
    spec = registry.get("07_mma")
    d64 = {spec.entries_by_head_dim[64], *(by_dim[64] for by_dim in spec.entries_by_split.values())}
    assert all(c["function"] in d64 for c in cases), [c["function"] for c in cases]
