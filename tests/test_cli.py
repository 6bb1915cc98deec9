import json
import subprocess
import sys

import pytest

from attnlab.env import has_gpu
from attnlab.registry import KERNELS


def run(*args):
    return subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True, timeout=600)


def test_list_names_every_kernel():
    out = run("list")
    assert out.returncode == 0
    for kid in KERNELS:
        assert kid in out.stdout


@pytest.mark.skipif(has_gpu(), reason="this case is about a machine without a GPU")
@pytest.mark.parametrize("cmd", ["check", "bench"])
def test_gpu_commands_refuse_without_gpu(cmd):
    out = run(cmd, "--quick")
    assert out.returncode == 2
    assert "no CUDA GPU" in out.stderr and "never fakes" in out.stderr


def test_inspect_one_kernel_one_arch():
    out = run("inspect", "01_scalar", "--arch", "sm_89")
    assert out.returncode == 0, out.stderr
    assert "01_scalar" in out.stdout and "no spill" in out.stderr


def test_inspect_json():
    out = run("inspect", "01_scalar", "--arch", "sm_90", "--json")
    (rep,) = json.loads(out.stdout)
    assert rep["arch"] == "sm_90" and rep["functions"][0]["spill_stores"] == 0


def test_inspect_unknown_kernel_fails():
    out = run("inspect", "99_nope")
    assert out.returncode != 0 and "unknown kernel" in out.stderr


def test_verify_results_passes_on_committed_records():
    out = run("verify-results")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "verify-results ok" in out.stdout


def test_report_json_is_a_list():
    out = run("report", "--json")
    assert out.returncode == 0
    assert isinstance(json.loads(out.stdout), list)
