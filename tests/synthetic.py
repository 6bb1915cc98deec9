"""Synthetic records for tests of the record machinery, and the scratch repository they are bound
to. The GPU is named TEST GPU, records live only in temporary folders, and none is ever committed:
real records come from real runs.

The scratch repository (`scratch_repository`) is a git repository holding a copy of kernels/ and
src/ in two commits: OLDER, where every kernel source ends in one more function (headers in one more
comment line), then NOW, the files as they are. A record made "now" is bound to NOW;
`synthetic_record(older=True)` is a record honestly made at OLDER, so every kernel of it is stale by
its source, and by its code: a function the record's binary held is gone.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from attnlab.records.timing import summarize

ROOT = Path(__file__).resolve().parents[1]
GPU_NAME = "TEST GPU (NVIDIA L4 table entry)"
OLDER_LINE = b"\n// an older version of this kernel\n"


def older_text(path: Path) -> bytes:
    """What OLDER appends to a kernel file: a function of its own in a .cu file (a comment alone
    would compile to the same code, and leave a record of it fresh), a comment in a header."""
    if path.suffix != ".cu":
        return OLDER_LINE
    name = "".join(c if c.isalnum() else "_" for c in path.stem)
    return OLDER_LINE + f'extern "C" __global__ void attnlab_older_{name}(int* flag) {{ *flag = 1; }}\n'.encode()
GIT = ("-c", "user.name=attnlab tests", "-c", "user.email=tests@attnlab.invalid", "-c", "commit.gpgsign=false")


def git(repo: Path, *args: str, date: str | None = None) -> str:
    env = dict(os.environ)
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    proc = subprocess.run(["git", "-C", str(repo), *GIT, *args], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def build_template(where: Path) -> Path:
    """kernels/ and src/ copied, everything else linked; commits OLDER then NOW."""
    where.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("kernels", "src"):
        shutil.copytree(ROOT / name, where / name, ignore=ignore)
    for entry in ROOT.iterdir():
        if entry.name not in ("kernels", "src", "results", ".git") and not entry.name.startswith("."):
            (where / entry.name).symlink_to(entry)
    git(where, "init", "-q", "-b", "main")
    now = {p: p.read_bytes() for p in (where / "kernels").iterdir() if p.suffix in (".cu", ".cuh")}
    for path, data in now.items():
        path.write_bytes(data + older_text(path))
    git(where, "add", "kernels", "src")
    git(where, "commit", "-q", "-m", "older", date="2020-01-01T00:00:00Z")
    for path, data in now.items():
        path.write_bytes(data)
    git(where, "add", "kernels", "src")
    git(where, "commit", "-q", "-m", "now", date="2020-01-02T00:00:00Z")
    return where


def timing(us, reps=10, inner=5):
    """A timing dict whose median and spread follow from its samples, as bench.device_time's do."""
    samples = [us * f for f in (0.95, 0.97, 0.99, 1.0, 1.0, 1.0, 1.01, 1.03, 1.06, 1.1)][:reps]
    return summarize(samples, len(samples), inner).to_dict()


def fake_gpu(name=GPU_NAME, cc="8.9", sms=58) -> dict:
    return {"name": name, "compute_capability": cc, "sm_count": sms, "driver": "0", "cuda_runtime": "0"}


def new_test_record(kind, specs, settings=None, gpu=GPU_NAME, created=None, make=None, cc="8.9", sms=58) -> dict:
    """attnlab.records.results.new_record (or `make`, the same function saved before a test replaced it) on
    TEST GPU, made in the repository ATTNLAB_ROOT names."""
    from attnlab.records.results import new_record

    rec = (make or new_record)(kind, specs, settings, gpu=fake_gpu(gpu, cc, sms), software={"torch": "0"})
    if created:
        rec["created_utc"] = created
    return rec


def older(rec: dict) -> dict:
    """Rebind a record to the OLDER commit, with the hashes of that commit's files: what a run at
    that commit would have written."""
    from attnlab.records.fingerprint import harness_digests, source_digests
    from attnlab.records.provenance import find_commit, repo_root
    from attnlab.kernels.registry import KERNELS

    sha = git(repo_root(), "rev-parse", "HEAD~1")
    commit, why = find_commit(sha)
    assert commit is not None, why
    rec["git"] = {"commit": sha, "tree": commit.tree, "dirty": False}
    for kid, meta in rec["kernels"].items():
        meta["sha256"] = next(source_digests(KERNELS[kid], commit.read))  # over every header: the first
    rec["harness"] = harness_digests(rec["harness"], commit.read)
    return rec


def scale(shape) -> float:
    """How much more work `shape` is than the mission shape (1, 8, 512, 64): synthetic times grow
    with it, so that no synthetic time breaks physics."""
    from attnlab.shapes import MISSION, Shape

    return Shape(*shape).flops(False) / MISSION.flops(False)


def synthetic_record(created="2026-01-01T00:00:00Z", kernel="01_scalar", older_source=False, kernel_us=100.0,
                     shapes=((1, 8, 512, 64),), gpu=GPU_NAME, also=(), cc="8.9", sms=58):
    """A bench record of `kernel` (and of the kernels `also` names, timed alike) on TEST GPU (or
    `gpu`, of compute capability `cc` and `sms` SMs)."""
    from attnlab.kernels.registry import get
    from attnlab.records.results import seal

    kernels = [kernel, *also]
    arch = "sm_" + cc.replace(".", "")
    rec = new_test_record("bench", [get(k, arch) for k in kernels], {"reps": 10}, gpu=gpu, created=created,
                          cc=cc, sms=sms)
    for shape in shapes:
        for causal in (False, True):
            rec["cases"].append({
                "shape": list(shape), "causal": causal, "sdpa_unavailable": {"cudnn": "not built"},
                "sdpa": {name: timing(us * scale(shape)) for name, us in (("flash", 20.0), ("efficient", 25.0),
                                                                          ("math", 80.0))},
                "kernels": {k: {"check": {"passed": True, "max_err": 1e-4, "tolerance": 1e-3, "reason": ""},
                                "device": timing(kernel_us * scale(shape)),
                                "host": timing(kernel_us * scale(shape) + 30)} for k in kernels},
            })
    matmul, copy = timing(1374.39), timing(8589.93)  # about 100 TFLOP/s and 250 GB/s, from their timings
    rec["ceilings"] = {"matmul": {"n": 4096, "tflops": 2.0 * 4096**3 / (matmul["median_us"] * 1e-6) / 1e12,
                                  "timing": matmul},
                       "copy": {"mib": 1024, "gbps": 2.0 * 2**30 / (copy["median_us"] * 1e-6) / 1e9, "timing": copy}}
    seal(rec)
    return older(rec) if older_source else rec
