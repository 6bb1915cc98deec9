"""Device time the way the brief asks: CUDA events around CUDA-graph replays.

Each measured function is warmed up (compiling and autotuning happen there, never inside a
timing), then replayed as a one-call CUDA graph for WARM_CLOCKS_US (clocks ramp up from idle);
its device time per call, from back-to-back replays, sets `inner` so that one replay holds about
TARGET_REPLAY_US of work. It is captured `inner` times into one CUDA graph, and the graph is
replayed `reps` times with an event pair around every replay. Graph replay removes Python and
launch overhead from the figure; the per-call time is the replay time over `inner`. Inputs stay in
L2 between calls (a warm figure: at the mission shape q, k, v are 1.5 MB), which is how a layer
sees them.

The latency a Python caller sees (perf_counter around call + synchronize, what the earlier
study measured) is timed separately and never mixed with device time.

Besides every SDPA backend, a case times the book's Triton reference (attnlab.gpu.triton_ref) under
case["baselines"]["triton"] where Triton imports on a GPU; case["baselines_unavailable"] says why
not otherwise. Ratios to "the fastest SDPA backend" (attnlab.records.results.report_rows) read "sdpa" only.
"""
from __future__ import annotations

import time
from typing import Callable

from ..records.timing import Timing, summarize

TARGET_REPLAY_US = 300.0   # enough work per replay that event resolution (~0.5 us) is noise
MAX_INNER = 200
WARM_CLOCKS_US = 50_000.0  # replays before any timing: an idle GPU takes tens of ms to reach its clocks


def _graph_of(fn: Callable[[], object], calls: int):
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="relaxed"):
        for _ in range(calls):
            fn()
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    return graph


def _replay_us(graph, replays: int) -> float:
    """Device time per replay of `graph`, over `replays` back-to-back replays between two events:
    the host enqueues a replay in a few microseconds, so the GPU never waits for Python between
    them (one event pair around one Python call would count the host's launch path too)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def device_time(fn: Callable[[], object], reps: int = 50, warmup: int = 5) -> Timing:
    """Median and p10/p90 device time of one call of `fn`, from CUDA-graph replays."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as graph capture requires
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    # One call's device time picks how many calls go into the timed graph, so that a replay holds
    # TARGET_REPLAY_US of work whatever the host's launch path costs; replaying it first for
    # WARM_CLOCKS_US brings the GPU to its clocks (a 10 us kernel timed from idle runs slower).
    one = _graph_of(fn, 1)
    single_us = max(_replay_us(one, 20), 0.5)
    _replay_us(one, int(min(20_000, max(1, WARM_CLOCKS_US // single_us))))
    inner = int(min(MAX_INNER, max(1, TARGET_REPLAY_US // single_us)))
    del one
    graph = _graph_of(fn, inner)

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in events:
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) * 1e3 / inner for s, e in events]
    del graph
    return summarize(samples, reps, inner)


def host_latency(fn: Callable[[], object], reps: int = 50, warmup: int = 5) -> Timing:
    """What a Python caller sees per call: perf_counter around fn() and a synchronize."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return summarize(samples, reps, 1)


def matmul_ceiling(n: int = 4096, reps: int = 20) -> dict:
    """TFLOP/s of an fp16 n x n x n cuBLAS matmul (fp32 accumulate): the reachable tensor-core rate."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    t = device_time(lambda: torch.matmul(a, b, out=c), reps=reps)
    return {"n": n, "tflops": 2.0 * n ** 3 / (t.median_us * 1e-6) / 1e12, "timing": t.to_dict()}


def copy_bandwidth(mib: int = 1024, reps: int = 20) -> dict:
    """GB/s of a device-to-device copy far larger than L2 (read + write counted)."""
    import torch

    n = mib * 2 ** 20
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = device_time(lambda: dst.copy_(src), reps=reps)
    return {"mib": mib, "gbps": 2.0 * n / (t.median_us * 1e-6) / 1e9, "timing": t.to_dict()}


def time_baselines(q, k, v, causal: bool, ref, fp16_err: float, reps: int) -> tuple[dict, dict]:
    """Baselines besides SDPA, timed like the kernels (checked first; a wrong one gets no time):
    the book's Triton reference (attnlab.gpu.triton_ref) where Triton imports and the shape suits it.
    Returns (timed, unavailable: name -> reason)."""
    import torch

    from ..pass_rule import judge

    timed, unavailable = {}, {}
    try:
        from . import triton_ref
    except Exception as exc:  # noqa: BLE001 - a broken Triton install is a reason, not a crash
        unavailable["triton"] = f"import failed: {type(exc).__name__}: {exc}"
        return timed, unavailable
    reason = triton_ref.available()
    if reason is None and q.shape[-1] not in triton_ref.HEAD_DIMS:
        reason = f"D={q.shape[-1]} (the Triton reference takes D in {triton_ref.HEAD_DIMS})"
    if reason is not None:
        unavailable["triton"] = reason
        return timed, unavailable
    out = torch.full_like(q, float("nan"))
    try:
        triton_ref.attention(q, k, v, causal, out=out)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - compile or launch failure: reported, not raised
        unavailable["triton"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return timed, unavailable
    verdict = judge(out, ref, fp16_err)
    entry = {"check": {"passed": verdict.passed, "max_err": verdict.max_err, "tolerance": verdict.tolerance,
                       "reason": verdict.reason}}
    if verdict.passed:
        entry["device"] = device_time(lambda: triton_ref.attention(q, k, v, causal, out=out), reps).to_dict()
        entry["host"] = host_latency(lambda: triton_ref.attention(q, k, v, causal, out=out), reps).to_dict()
    timed["triton"] = entry
    return timed, unavailable


def bench_case(specs, shape, causal: bool, reps: int, progress=None) -> dict:
    """Every SDPA backend, the Triton reference and every kernel at one shape, in one run, on the
    same inputs."""
    import torch

    from ..kernels.contract import validate
    from ..pass_rule import judge, make_inputs
    from ..reference import SDPA_BACKENDS, naive_fp16, reference_attention, sdpa, sdpa_availability
    from .launch import attention

    q, k, v = make_inputs(shape, seed=0)
    case = {"shape": list(shape), "causal": causal, "sdpa": {}, "sdpa_unavailable": {}, "kernels": {}}
    for name, reason in sdpa_availability(q, k, v, causal).items():
        if reason is not None:
            case["sdpa_unavailable"][name] = reason
    for name in SDPA_BACKENDS:
        if name in case["sdpa_unavailable"]:
            continue
        case["sdpa"][name] = device_time(lambda: sdpa(q, k, v, causal, backend=name), reps).to_dict()
        case["sdpa"][name]["host"] = host_latency(lambda: sdpa(q, k, v, causal, backend=name), reps).to_dict()
    ref = reference_attention(q, k, v, causal)
    fp16_err = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
    case["baselines"], case["baselines_unavailable"] = time_baselines(q, k, v, causal, ref, fp16_err, reps)
    for spec in specs:
        try:
            validate(spec, q, k, v, causal)
        except ValueError as exc:
            case["kernels"][spec.id] = {"skipped": str(exc)}
            continue
        out = torch.full_like(q, float("nan"))
        attention(spec.id, q, k, v, causal=causal, out=out)
        torch.cuda.synchronize()
        verdict = judge(out, ref, fp16_err)
        entry = {"check": {"passed": verdict.passed, "max_err": verdict.max_err,
                           "tolerance": verdict.tolerance, "reason": verdict.reason},
                 # what ran: chapter 7's key split and grid follow the shape and the GPU's SM count
                 "launch": {key: list(val) if isinstance(val, tuple) else val
                            for key, val in spec.launch_config(shape).items()}}
        if verdict.passed:  # a wrong output gets no time, as in time_baselines
            entry["device"] = device_time(lambda: attention(spec.id, q, k, v, causal=causal, out=out), reps).to_dict()
            entry["host"] = host_latency(lambda: attention(spec.id, q, k, v, causal=causal, out=out), reps).to_dict()
        case["kernels"][spec.id] = entry
        if progress is not None:
            progress.update(1)
    return case


def run_bench(specs, shapes, causal_flags=(False, True), quick: bool = False, progress: bool = True) -> dict:
    """Time kernels next to SDPA over shapes; returns a record (see results.py) ready to write."""
    from tqdm.auto import tqdm

    from ..env import require_gpu
    from ..records.results import new_record

    require_gpu("benchmarking")
    reps = 20 if quick else 100
    record = new_record("bench", specs, settings={"quick": quick, "reps": reps, "l2": "warm",
                                                 "timer": "cuda events around cuda-graph replays"})
    record["ceilings"] = {"matmul": matmul_ceiling(reps=10 if quick else 30),
                          "copy": copy_bandwidth(mib=256 if quick else 1024, reps=10 if quick else 30)}
    work = [(s, c) for s in shapes for c in causal_flags]
    with tqdm(total=len(work) * len(specs), desc="bench", unit="run", disable=not progress) as bar:
        for shape, causal in work:
            record["cases"].append(bench_case(specs, shape, causal, reps, bar))
    return record


def failed_cases(record: dict) -> list[tuple[str, list, bool]]:
    """(kernel, shape, causal) of every case whose output failed the check: bench_case gave it no
    time, and callers refuse the run."""
    return [(kid, c["shape"], c["causal"]) for c in record["cases"] for kid, e in c["kernels"].items()
            if "check" in e and not e["check"]["passed"]]
