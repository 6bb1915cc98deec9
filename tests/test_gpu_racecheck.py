"""On a GPU: what compute-sanitizer's racecheck makes of the named-barrier hand-offs chapter 6 is
built on (tests/gpu_probes/named_barrier_handoff.py). PTX (ISA 9.7.13.1) says that when a barrier
completes, the memory accesses each participant made before it, bar.arrive's included, are
performed relative to all participants: reads too. On the first H100 run (CUDA 13.0), racecheck
found the missing barrier, accepted the producer's bar.arrive before the consumer's bar.sync, and
reported a WAR hazard when the consumer released a buffer with bar.arrive and the producer refilled
it after bar.sync, the ring of chapter 6, whose racecheck records carry the same WAR. This test
pins that behaviour down: the day racecheck reads the release as PTX defines it, it fails, and
chapter 6's kernels are to be sanitized again."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).parent / "gpu_probes" / "named_barrier_handoff.py"
EXPECTED = {  # kernel -> (hazard kinds racecheck reports, output right; None: a race, either)
    "no_barrier": ({"RAW"}, None),
    "sync_both": (set(), True),
    "producer_arrives": (set(), True),
    "cp_async_then_arrive": (set(), True),
    "consumer_releases": ({"WAR"}, True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", sorted(EXPECTED))
def test_racecheck_on_a_named_barrier_handoff(kernel):
    pytest.importorskip("cupy")
    exe = shutil.which("compute-sanitizer")
    if exe is None:
        pytest.skip("compute-sanitizer is not on PATH")
    proc = subprocess.run([exe, "--tool=racecheck", "--racecheck-report=hazard", sys.executable, str(PROBE), kernel],
                          capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    assert "RACECHECK SUMMARY" in text, text[-2000:]
    kinds = set(re.findall(r"Potential (\w+) hazard", text))
    hazards, right = EXPECTED[kernel]
    assert kinds == hazards, text[-3000:]
    if right is not None:
        assert f"{kernel}: output {'right' if right else 'WRONG'}" in text, text[-2000:]
