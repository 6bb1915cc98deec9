"""A synthetic record for tests of the record machinery. Its GPU is named TEST GPU, it lives only
in a temporary folder, and it is never committed: real records come from real runs."""
from attnlab.results import SCHEMA, current_hashes


def timing(us):
    return {"median_us": us, "p10_us": us * 0.95, "p90_us": us * 1.1, "reps": 10, "inner": 5}


def synthetic_record(created="2026-01-01T00:00:00Z", kernel="01_scalar", sha=None, kernel_us=100.0,
                     shapes=((1, 8, 512, 64),), gpu="TEST GPU (NVIDIA L4 table entry)"):
    sha = sha or current_hashes()[kernel]
    cases = []
    for shape in shapes:
        for causal in (False, True):
            cases.append({
                "shape": list(shape), "causal": causal, "sdpa_unavailable": {"cudnn": "not built"},
                "sdpa": {"flash": timing(20.0), "efficient": timing(25.0), "math": timing(80.0)},
                "kernels": {kernel: {"check": {"passed": True, "max_err": 1e-4, "tolerance": 1e-3, "reason": ""},
                                     "device": timing(kernel_us * (shape[2] / 512) ** 2),
                                     "host": timing(kernel_us + 30)}},
            })
    return {
        "schema": SCHEMA, "kind": "bench", "created_utc": created,
        "gpu": {"name": gpu, "compute_capability": "8.9", "sm_count": 58, "driver": "0", "cuda_runtime": "0"},
        "software": {"torch": "0"}, "git": {"commit": "0" * 40, "dirty": False}, "harness_sha256": "0" * 64,
        "kernels": {kernel: {"sha256": sha, "source": "01_scalar.cu"}}, "settings": {},
        "ceilings": {"matmul": {"tflops": 100.0}, "copy": {"gbps": 250.0}},
        "cases": cases,
    }
