"""The launch path without a GPU, on a fake CuPy: a kernel is loaded once per source version and
device, its shared-memory opt-in is set once per size, an edited source loads anew, and tensors go
to the kernel as raw 64-bit pointers (no cupy.asarray, which queries pointer attributes per call)."""
from __future__ import annotations

import shutil
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from attnlab.kernels import compile, registry
from attnlab.gpu import hybrid, launch
from attnlab.paths import repo_root
from attnlab.shapes import Shape
from attnlab.kernels.sources import source_files

KERNEL = "05_wmma"   # one entry for every D; 62464 B of dynamic shared memory at D=64, 95232 at 128
STREAM = 0xABC       # the handle of torch's current stream, as the fake torch reports it


class FakeKernel:
    """A cupy.RawKernel that records its launches and every shared-memory opt-in."""

    def __init__(self, name: str):
        self.name = name
        self.launches: list[dict] = []
        self.opt_ins: list[int] = []

    @property
    def max_dynamic_shared_size_bytes(self):
        return self.opt_ins[-1] if self.opt_ins else 0

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        self.opt_ins.append(value)

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        self.launches.append({"grid": grid, "block": block, "args": args, "shared_mem": shared_mem,
                              "stream": stream.ptr if stream is not None else None})


class FakeModule:
    def __init__(self, source_hash: str):
        self.source_hash = source_hash
        self.kernels: list[FakeKernel] = []

    def get_function(self, name: str) -> FakeKernel:
        self.kernels.append(FakeKernel(name))
        return self.kernels[-1]


class Device:
    entered: list = []

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        Device.entered.append(self.index)

    def __exit__(self, *exc):
        return False


def _no_asarray(obj):
    raise AssertionError("cupy.asarray on the launch path: it queries the pointer's attributes each call")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A fake cupy and a GPU-less torch that claims device 0, over a copy of the kernels under
    tmp_path (ATTNLAB_ROOT) so a test can edit a source. Returns the modules loaded, in order."""
    cupy = types.ModuleType("cupy")
    cupy.asarray = _no_asarray
    cupy.cuda = SimpleNamespace(Device=Device, Stream=SimpleNamespace(
        from_external=lambda obj: SimpleNamespace(ptr=obj.__cuda_stream__()[1])))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    Device.entered = []

    for kernel_id in (KERNEL, "04_cublas_hybrid"):
        for path in source_files(registry.get(kernel_id)):
            copy = tmp_path / path.resolve().relative_to(repo_root())
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, copy)
    monkeypatch.setenv("ATTNLAB_ROOT", str(tmp_path))

    modules: list[FakeModule] = []

    def load(kernel_id, source_hash, arch, which, defines=()):
        modules.append(FakeModule(source_hash))
        return modules[-1]

    monkeypatch.setattr(compile, "_load", load)
    monkeypatch.setattr(compile, "_functions", {})
    monkeypatch.setattr(compile, "require_gpu", lambda what="": None)
    monkeypatch.setattr(compile, "_device_arch", lambda index: "sm_90")
    monkeypatch.setattr(compile, "backend", lambda: "nvcc")
    monkeypatch.setattr(launch, "_smem_opt_in", {})
    monkeypatch.setattr(launch, "_streams", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=STREAM))
    return modules


class FakeTensor:
    """What launch() reads of a validated CUDA tensor: its address and its device."""

    def __init__(self, address: int, index: int = 0):
        self.address = address
        self.device = SimpleNamespace(type="cuda", index=index)

    def data_ptr(self) -> int:
        return self.address


def run(shape: Shape, index: int = 0, causal: bool = False, base: int = 0x7F0000000000):
    q, k, v, out = (FakeTensor(base + i * 0x100000, index) for i in range(4))
    launch.launch(registry.get(KERNEL), shape, q, k, v, out, causal, 0.125)
    return q, k, v, out


def kernels(modules) -> list[FakeKernel]:
    return [kern for m in modules for kern in m.kernels]


def test_two_launches_load_once_and_opt_in_once(fake):
    run(Shape(1, 2, 128, 64))
    run(Shape(1, 2, 128, 64))
    (kern,) = kernels(fake)
    assert len(fake) == 1 and kern.name == registry.get(KERNEL).entry
    assert kern.opt_ins == [62464]
    assert [x["shared_mem"] for x in kern.launches] == [62464, 62464]
    assert all(x["stream"] == STREAM for x in kern.launches), "not on torch's current stream"
    assert Device.entered == [0, 0, 0]  # the load, then each launch


def test_a_larger_request_opts_in_again_and_a_smaller_does_not(fake):
    for D in (64, 128, 64, 128):
        run(Shape(1, 1, 64, D))
    (kern,) = kernels(fake)
    assert kern.opt_ins == [62464, 95232]
    assert len(kern.launches) == 4


def test_an_edited_source_loads_anew(fake, tmp_path):
    run(Shape(1, 1, 64, 64))
    source = tmp_path / "kernels" / registry.get(KERNEL).source
    source.write_text(source.read_text() + "\n// edited\n")
    run(Shape(1, 1, 64, 64))
    run(Shape(1, 1, 64, 64))
    assert len(fake) == 2 and fake[0].source_hash != fake[1].source_hash
    first, second = kernels(fake)
    assert (len(first.launches), len(second.launches)) == (1, 2)
    assert first.opt_ins == second.opt_ins == [62464]


def test_each_device_loads_its_own(fake):
    run(Shape(1, 1, 64, 64), index=0)
    run(Shape(1, 1, 64, 64), index=1)
    run(Shape(1, 1, 64, 64), index=1)
    on0, on1 = kernels(fake)
    assert (len(on0.launches), len(on1.launches)) == (1, 2)
    assert on0.opt_ins == on1.opt_ins == [62464]
    assert Device.entered == [0, 0, 1, 1, 1]


def test_args_are_raw_pointers_and_exact_scalars(fake):
    q, k, v, out = run(Shape(2, 3, 100, 64), causal=True)
    (kern,) = kernels(fake)
    args = kern.launches[0]["args"]
    assert [type(a) for a in args] == [np.uint64] * 4 + [np.int32, np.int32, np.float32, np.int32]
    assert [int(a) for a in args[:4]] == [t.data_ptr() for t in (q, k, v, out)]
    assert [a.item() for a in args[4:]] == [100, 64, 0.125, 1]


def test_the_hybrid_passes_its_scores_as_a_pointer_and_loads_once(fake, monkeypatch):
    monkeypatch.setattr(hybrid, "score_budget", lambda device: 1 << 40)
    spec = registry.get("04_cublas_hybrid")
    q, k, v = (torch.randn(1, 2, 8, 16).half() for _ in range(3))
    for causal in (False, True):
        hybrid.run_cublas_hybrid(spec, Shape(*q.shape), q, k, v, torch.empty_like(q), causal, 0.25)
    (kern,) = kernels(fake)
    assert kern.name == spec.entry and kern.opt_ins == []
    for launched, causal in zip(kern.launches, (False, True)):
        args = launched["args"]
        assert [type(a) for a in args] == [np.uint64, np.int32, np.float32, np.int32]
        assert [a.item() for a in args[1:]] == [8, 0.25, int(causal)]
