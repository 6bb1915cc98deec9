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


def test_inspect_lists_each_function_once_under_the_id_that_launches_it():
    """Chapter 7's ids share one source: each id's rows are its own entries, no row twice."""
    out = run("inspect", "07_mma", "07_mma_single_buffer", "--arch", "sm_89")
    assert out.returncode == 0, out.stderr
    rows = [line.split()[:3] for line in out.stdout.splitlines()[1:]]
    assert len(rows) == len({tuple(r) for r in rows}), out.stdout
    ablation = {fn for kid, fn, _ in rows if kid == "07_mma_single_buffer"}
    assert ablation == {"attn_fwd_07_mma_single_buffer_d64", "attn_fwd_07_mma_single_buffer_d128"}
    assert not any("single_buffer" in fn for kid, fn, _ in rows if kid == "07_mma")


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


# --- mistakes: exit 2, one line on stderr that names the problem, no traceback -----------------

def cli(capsys, *args):
    """attnlab.cli.main in this process: (exit status, stdout, stderr)."""
    from attnlab.cli import main

    status = main(list(args))
    out = capsys.readouterr()
    return status, out.out, out.err


def refusal(status, err):
    """The one line of a refused command (after asserting there is exactly one, and exit 2)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("cmd", [["inspect"], ["check"], ["check", "--cpu"], ["bench"], ["sanitize"], ["profile"],
                                 ["search"]])
def test_unknown_kernel_is_named_before_any_gpu_check(capsys, cmd):
    line = refusal(*cli(capsys, *cmd, "no_such_kernel")[::2])
    assert line.startswith(f"attnlab {cmd[0]}: unknown kernel 'no_such_kernel'")
    assert "python -m attnlab list" in line and "GPU" not in line


def test_unknown_kernel_suggests_the_closest_id(capsys):
    line = refusal(*cli(capsys, "inspect", "07_mma_noswizle")[::2])
    assert "did you mean '07_mma_noswizzle'?" in line


def test_unknown_mutant_suggests_the_closest_id(capsys):
    line = refusal(*cli(capsys, "mutate", "07-tile-tial")[::2])
    assert "unknown mutant '07-tile-tial'" in line and "did you mean '07-tile-tail'?" in line


def test_search_refuses_a_kernel_without_knobs(capsys):
    line = refusal(*cli(capsys, "search", "01_scalar")[::2])
    assert "01_scalar has no knobs to search" in line and "07_mma" in line


@pytest.mark.parametrize("args, says", [
    (["bench", "--shape", "1", "0", "512", "64"], "argument --shape: '0' is not a positive integer"),
    (["search", "--shape", "1", "8", "x", "64"], "argument --shape: 'x' is not a positive integer"),
    (["bench", "--shape", "1", "8", "512", "256"], "no kernel supports head dim D=256"),
    (["bench", "07_mma", "--shape", "1", "8", "512", "96"], "07_mma supports head dim D in 64, 128; got D=96"),
    (["profile", "07_mma", "--shape", "1", "8", "512", "96"], "07_mma supports head dim D in 64, 128; got D=96"),
    (["search", "--shape", "1", "8", "512", "96"], "07_mma supports head dim D in 64, 128; got D=96"),
    (["bench", "--shape", "70000", "1", "64", "64"], "B*H = 70000 exceeds 65535"),
])
def test_a_shape_the_kernels_cannot_take_is_refused_before_any_gpu_check(capsys, args, says):
    line = refusal(*cli(capsys, *args)[::2])
    assert says in line and "GPU" not in line


D128 = ["--shape", "2", "16", "4096", "128"]


def test_bench_of_named_kernels_at_several_shapes_leaves_out_what_a_kernel_cannot_take(capsys, monkeypatch):
    import attnlab.gpus

    # the L4's tiles, where chapter 7's fixed split takes D = 64 alone, whatever GPU runs the test
    monkeypatch.setattr(attnlab.gpus, "arch_at_hand", lambda: ("sm_89", "the L4's"))
    line = refusal(*cli(capsys, "bench", "07_mma", "07_mma_split4", *D128, "--shape", "1", "8", "512", "128")[::2])
    assert line == ("attnlab bench: 07_mma_split4 takes none of the shapes given: "
                    "07_mma_split4 supports head dim D in 64; got D=128")
    if has_gpu():
        return
    status, _, err = cli(capsys, "bench", "07_mma", "07_mma_split4", "--shape", "1", "8", "512", "64", *D128)
    left_out, refused = [line for line in err.splitlines() if line.strip()]
    assert left_out == "left out: 07_mma_split4 supports head dim D in 64; got D=128"
    assert status == 2 and refused.startswith("attnlab bench: no CUDA GPU here")


@pytest.mark.parametrize("cmd", [["inspect", "01_scalar"], ["search", "--static"], ["prebuild"]])
def test_junk_arch_is_refused(capsys, cmd):
    line = refusal(*cli(capsys, *cmd, "--arch", "foo")[::2])
    assert "argument --arch: 'foo' is not a GPU target like sm_80" in line


@pytest.mark.parametrize("args, says", [
    (["sanitize", "--tool", "foo"], "argument --tool: invalid choice: 'foo'"),
    (["bench", "--shape", "1", "2"], "argument --shape: expected 4 arguments"),
    (["search", "--causal", "maybe"], "argument --causal: 'maybe' is not true or false"),
    (["frob"], "argument cmd: invalid choice: 'frob'"),
])
def test_argparse_errors_are_one_line_not_a_usage_block(args, says):
    out = run(*args)
    line = refusal(out.returncode, out.stderr)
    cmd = "" if args[0] == "frob" else " " + args[0]
    assert line.startswith(f"python -m attnlab{cmd}: error: ") and line.endswith("(see --help)")
    assert says in line and "usage:" not in out.stderr


@pytest.mark.skipif(has_gpu(), reason="this case is about a machine without a GPU")
@pytest.mark.parametrize("cmd", ["check", "bench", "sanitize", "profile"])
def test_gpu_commands_without_gpu_say_so_in_one_line(capsys, cmd):
    line = refusal(*cli(capsys, cmd)[::2])
    assert line.startswith(f"attnlab {cmd}: no CUDA GPU here")


@pytest.mark.skipif(has_gpu(), reason="this case is about a machine without a GPU")
def test_search_without_gpu_shows_the_static_space_and_succeeds():
    out = run("search", "07_mma", "--shape", "1", "8", "512", "64")
    assert out.returncode == 0, out.stderr
    assert "07_mma at D=64 on sm_89" in out.stdout
    (line,) = [line for line in out.stderr.splitlines() if line.strip()]
    assert "nothing is measured" in line


def test_import_evidence_of_a_missing_file_is_one_line(capsys, tmp_path):
    line = refusal(*cli(capsys, "import-evidence", str(tmp_path / "nope.tar.gz"))[::2])
    assert line == f"attnlab import-evidence: no such file: {tmp_path / 'nope.tar.gz'}"


def _no_nvcc(monkeypatch):
    from attnlab import toolchain
    from attnlab.toolchain import ToolMissing

    def missing():
        raise ToolMissing("nvcc is not in this Python environment: pip install it\nsecond line")
    monkeypatch.setattr(toolchain, "nvcc", missing)


@pytest.mark.parametrize("cmd", [["inspect", "01_scalar"], ["prebuild"]])
def test_a_missing_tool_is_one_line(capsys, monkeypatch, cmd):
    _no_nvcc(monkeypatch)
    line = refusal(*cli(capsys, *cmd)[::2])
    assert line == f"attnlab {cmd[0]}: nvcc is not in this Python environment: pip install it"


def test_a_missing_tool_in_the_static_search_is_one_line(capsys, monkeypatch):
    from attnlab import search
    from attnlab.toolchain import ToolMissing

    def missing(*args, **kwargs):
        raise ToolMissing("cuobjdump not found: pip install it")
    monkeypatch.setattr(search, "static_space", missing)
    line = refusal(*cli(capsys, "search", "--static")[::2])
    assert line == "attnlab search: cuobjdump not found: pip install it"


def test_a_compile_failure_stays_a_failure_with_its_log(capsys, monkeypatch):
    from attnlab import static, toolchain
    from attnlab.compile import KernelBuildError

    monkeypatch.setattr(toolchain, "nvcc", lambda: "nvcc")
    monkeypatch.setattr(toolchain, "cuobjdump", lambda: "cuobjdump")

    def refused(spec, arch):
        raise KernelBuildError(f"nvcc failed for {spec.id} ({arch}):\nkernel.cu(1): error: planted")
    monkeypatch.setattr(static, "inspect_kernel", refused)
    status, _, err = cli(capsys, "inspect", "01_scalar", "--arch", "sm_89", "--json")
    assert status == 1 and "FAIL nvcc failed for 01_scalar (sm_89)" in err and "error: planted" in err


# --- report ------------------------------------------------------------------------------------

def test_report_without_a_record_says_so_in_one_sentence(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLAB_RESULTS", str(tmp_path))
    status, out, err = cli(capsys, "report")
    assert status == 0 and err == ""
    assert out == (f"No fresh bench record under {tmp_path.resolve()}: `python -m attnlab bench` "
                   "on a GPU makes one.\n")
    assert cli(capsys, "report", "--json")[:2] == (0, "[]\n")


def test_report_with_a_record_prints_a_header_row(capsys, monkeypatch, tmp_path, scratch_repository):
    from synthetic import synthetic_record

    from attnlab.results import write_record

    monkeypatch.setenv("ATTNLAB_RESULTS", str(tmp_path))
    write_record(synthetic_record(kernel_us=40.0))
    status, out, _ = cli(capsys, "report")
    header, *rows = out.splitlines()
    assert status == 0
    assert header.split() == ["gpu", "kernel", "shape", "causal", "kernel", "µs", "SDPA", "SDPA", "µs", "vs",
                              "SDPA", "check"]
    assert len(rows) == 2 and all("TEST GPU" in r and "01_scalar" in r and "flash" in r for r in rows)
    assert "x0.50" in rows[0] and rows[0].endswith("pass")
