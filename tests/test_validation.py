"""Every bad input gets a clear error before any launch. These run on the CPU: validation comes
first, and the device check is last, so each rule is reachable without a GPU."""
import dataclasses

import pytest
import torch

from attnlab.kernels import registry
from attnlab.env import NoGpuError, has_gpu
from attnlab.kernels.contract import AttentionInputError, validate
from attnlab.gpu.launch import attention

SPEC = registry.get("01_scalar")


def qkv(shape=(1, 2, 16, 64), dtype=torch.float16):
    return tuple(torch.randn(shape).to(dtype) for _ in range(3))


def test_wrong_type():
    q, k, v = qkv()
    with pytest.raises(AttentionInputError, match="k must be a torch.Tensor"):
        validate(SPEC, q, k.numpy(), v)


def test_wrong_rank():
    q, k, v = qkv((2, 16, 64))
    with pytest.raises(AttentionInputError, match=r"4-D \[B, H, L, D\]"):
        validate(SPEC, q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_wrong_dtype(dtype):
    with pytest.raises(AttentionInputError, match="must be torch.float16"):
        validate(SPEC, *qkv(dtype=dtype))


def test_empty():
    with pytest.raises(AttentionInputError, match="is empty"):
        validate(SPEC, *qkv((1, 2, 0, 64)))


def test_shape_mismatch():
    q, k, v = qkv()
    with pytest.raises(AttentionInputError, match="v has shape"):
        validate(SPEC, q, k, v[:, :, :8].contiguous())


def test_non_contiguous():
    q, k, v = qkv((1, 16, 2, 64))
    with pytest.raises(AttentionInputError, match="not contiguous"):
        validate(SPEC, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


@pytest.mark.parametrize("D", [129, 256])
def test_head_dim_too_large(D):
    with pytest.raises(AttentionInputError, match=r"head dim D in 1..128; got D=" + str(D)):
        validate(SPEC, *qkv((1, 1, 4, D)))


def test_head_dim_outside_a_fixed_set():
    spec = dataclasses.replace(SPEC, head_dims=frozenset({64, 128}))
    with pytest.raises(AttentionInputError, match="64, 128; got D=96"):
        validate(spec, *qkv((1, 1, 4, 96)))


def test_causal_unsupported():
    spec = dataclasses.replace(SPEC, causal=False)
    with pytest.raises(AttentionInputError, match="no causal mode"):
        validate(spec, *qkv(), causal=True)


def test_length_limit():
    spec = dataclasses.replace(SPEC, max_len=8)
    with pytest.raises(AttentionInputError, match="L <= 8; got L=16"):
        validate(spec, *qkv())


def test_too_many_heads_for_the_grid():
    with pytest.raises(AttentionInputError, match="grid's y limit"):
        validate(SPEC, *qkv((65536, 1, 1, 8)))


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), "0.1"])
def test_bad_scale(scale):
    with pytest.raises(AttentionInputError, match="scale must be a finite number"):
        validate(SPEC, *qkv(), scale=scale)


def test_out_checked_like_inputs():
    q, k, v = qkv()
    with pytest.raises(AttentionInputError, match="out must be torch.float16"):
        validate(SPEC, q, k, v, out=torch.empty(q.shape, dtype=torch.float32))


@pytest.mark.skipif(has_gpu(), reason="this case is about a machine without a GPU")
def test_cpu_tensors_without_gpu_say_so():
    with pytest.raises(NoGpuError, match="torch sees none"):
        attention("01_scalar", *qkv())


@pytest.mark.gpu
def test_cpu_tensors_with_gpu_ask_to_move():
    with pytest.raises(AttentionInputError, match=r"move q, k, v to the GPU"):
        attention("01_scalar", *qkv())


@pytest.mark.gpu
def test_out_may_not_alias_an_input():
    q, k, v = (t.cuda() for t in qkv())
    with pytest.raises(AttentionInputError, match="alias"):
        attention("01_scalar", q, k, v, out=q)

