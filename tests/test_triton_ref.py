"""The book's Triton reference (attnlab.gpu.triton_ref).

Where Triton is not installed (the CPU machines), it must say so and refuse plainly. Where it is,
Triton's interpreter (TRITON_INTERPRET=1) runs the kernel on the CPU, in a child process (the
variable is read when the kernel is defined), and the output must pass the book's rule against the
fp64 reference at awkward shapes, causal and not, D = 64 and 128. On a GPU,
tests/test_gpu_chapters_8_9.py checks it on the device, and bench records time it.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from attnlab.gpu import triton_ref

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_without_triton_it_says_so(monkeypatch):
    import torch

    monkeypatch.setattr(triton_ref, "triton", None)
    monkeypatch.setattr(triton_ref, "_IMPORT_ERROR", "ModuleNotFoundError: No module named 'triton'")
    assert "triton is not installed" in triton_ref.available()
    q = torch.zeros(1, 1, 4, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="cannot run here"):
        triton_ref.attention(q, q, q)


CHILD = r"""
import torch
from attnlab.gpu import triton_ref
from attnlab.pass_rule import judge, make_inputs
from attnlab.reference import naive_fp16, reference_attention
from attnlab.shapes import Shape
assert triton_ref.available() is None, triton_ref.available()
for shape in (Shape(1, 2, 17, 64), Shape(1, 1, 130, 128), Shape(2, 1, 200, 64), Shape(1, 1, 1, 128)):
    q, k, v = make_inputs(shape, seed=1, device="cpu")
    for causal in (False, True):
        ref = reference_attention(q, k, v, causal)
        fp16 = float((naive_fp16(q, k, v, causal).double() - ref).abs().max())
        out = torch.full_like(q, float("nan"))
        triton_ref.attention(q, k, v, causal, out=out)
        verdict = judge(out, ref, fp16)
        assert verdict.passed, (shape, causal, verdict)
print("ok")
"""


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed: `pip install -r requirements.txt` brings it")
def test_interpreted_kernel_passes_the_rule():
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_refuses_bad_input_before_running():
    import torch

    with pytest.raises(ValueError, match="D in"):
        triton_ref.attention(*(torch.zeros(1, 1, 4, 96, dtype=torch.float16),) * 3)
