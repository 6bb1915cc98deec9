"""The device timer (attnlab.gpu.bench.device_time) against a fake CUDA whose clock we set: a kernel
of 10 us whose Python launch path takes 200 us, a graph replay that costs 2 us of its own. The
timer must size its graphs from device time (one event pair around one Python call would see
210 us and put one call in each replay, so that every sample carried the replay's own cost), and
replay the one-call graph for WARM_CLOCKS_US before it times anything (clocks ramp up from idle).
No GPU is needed: this is arithmetic on the fake clock."""
from __future__ import annotations

import contextlib
import sys
import types

import pytest

from attnlab.gpu import bench

KERNEL_US = 10.0
HOST_LAUNCH_US = 200.0   # what Python costs between two events around one call
REPLAY_COST_US = 2.0     # a graph replay's own cost on the device


class FakeCuda:
    """A device clock that only moves when work runs on it."""

    def __init__(self):
        self.clock = 0.0
        self.capturing = None
        self.replayed_calls = 0  # kernel calls run by replays so far

    def call(self):
        if self.capturing is not None:
            self.capturing.calls += 1
        else:  # an eager launch: the GPU idles while Python launches it
            self.clock += HOST_LAUNCH_US + KERNEL_US

    def module(self):
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = fake.clock

            def elapsed_time(self, end):
                return (end.t - self.t) / 1e3  # ms, as torch answers

        class CUDAGraph:
            def __init__(self):
                self.calls = 0

            def replay(self):
                fake.clock += REPLAY_COST_US + self.calls * KERNEL_US
                fake.replayed_calls += self.calls

        class Stream:
            def wait_stream(self, other):
                pass

        @contextlib.contextmanager
        def graph(g, capture_error_mode=None):
            fake.capturing = g
            try:
                yield
            finally:
                fake.capturing = None

        cuda = types.SimpleNamespace(
            Event=Event, CUDAGraph=CUDAGraph, Stream=Stream, graph=graph, synchronize=lambda: None,
            current_stream=lambda: Stream(), stream=lambda s: contextlib.nullcontext())
        return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def fake(monkeypatch):
    f = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", f.module())
    return f


def test_graphs_are_sized_from_device_time_not_from_the_launch_path(fake):
    t = bench.device_time(fake.call, reps=30)
    single = KERNEL_US + REPLAY_COST_US
    assert t.inner == int(bench.TARGET_REPLAY_US // single)  # 25, where the launch path would give 1
    assert t.median_us == pytest.approx(KERNEL_US + REPLAY_COST_US / t.inner, abs=1e-3)
    assert t.reps == 30 and len(t.samples_us) == 30


def test_the_clocks_are_warmed_before_anything_is_timed(fake):
    bench.device_time(fake.call, reps=10)
    one_call_replays = fake.replayed_calls - 10 * int(bench.TARGET_REPLAY_US // (KERNEL_US + REPLAY_COST_US))
    # the 20 replays that measure one call, the warm-up, the first replay of each graph
    assert one_call_replays * (KERNEL_US + REPLAY_COST_US) >= bench.WARM_CLOCKS_US


def test_a_long_kernel_gets_one_call_per_replay(fake, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "KERNEL_US", 1000.0)
    t = bench.device_time(fake.call, reps=5)
    assert t.inner == 1 and t.median_us == pytest.approx(1000.0 + REPLAY_COST_US, abs=1e-3)
