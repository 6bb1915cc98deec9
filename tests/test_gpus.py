import pytest

from attnlab.gpus import arithmetic_intensity, by_key, floor, lookup, tflops
from attnlab.shapes import MISSION, Shape


@pytest.mark.parametrize("name,key", [
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA A10", "A10"),
])
def test_lookup_by_device_name(name, key):
    assert lookup(name).key == key


def test_unknown_gpu_is_none():
    assert lookup("Some Future GPU") is None


def test_flops_and_causal_halving():
    assert MISSION.flops(False) == 4 * 8 * 512 * 512 * 64
    assert MISSION.flops(True) == MISSION.flops(False) / 2
    assert MISSION.io_bytes() == 4 * 8 * 512 * 64 * 2


def test_floor_on_l4_mission_shape():
    l4 = by_key("L4")
    f = floor(MISSION, l4)
    assert f.compute_us == pytest.approx(MISSION.flops(False) / 121e12 * 1e6)
    assert f.memory_us == pytest.approx(MISSION.io_bytes() / 300e9 * 1e6)
    assert f.us == max(f.compute_us, f.memory_us)
    # At L = 512, D = 64 the intensity (L/2 = 256 FLOP/B) sits below the L4's ridge (~403): memory-bound.
    assert arithmetic_intensity(MISSION) == pytest.approx(256.0)
    assert f.bound == "memory"
    assert floor(Shape(1, 8, 8192, 64), l4).bound == "compute"


def test_tflops_inverts_time():
    assert tflops(MISSION, False, 10.0) == pytest.approx(MISSION.flops(False) / 1e-5 / 1e12)
