import json
import subprocess
import sys

import pytest

from attnlab.env import has_gpu
from attnlab.kernels.registry import KERNELS


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
    (["check", "--shape", "1", "0", "512", "64"], "argument --shape: '0' is not a positive integer"),
    (["check", "--shape", "1", "8", "512", "256"], "no kernel supports head dim D=256"),
    (["check", "07_mma", "--shape", "1", "8", "512", "96"], "07_mma supports head dim D in 64, 128; got D=96"),
    (["check", "--cpu", "07_mma", "--shape", "1", "8", "512", "96"], "07_mma supports head dim D in 64, 128; got D=96"),
    (["check", "--cpu", "07_mma@sm_90", "--shape", "1", "2", "65", "96"],
     "07_mma supports head dim D in 64, 128; got D=96"),
    (["check", "--cpu", "--shape", "70000", "1", "64", "64"], "B*H = 70000 exceeds 65535"),
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


@pytest.mark.parametrize("cmd", [["inspect", "01_scalar"], ["search", "--static"], ["prebuild"],
                                 ["check", "--cpu", "07_mma"]])
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
    # the one line of the refusal to measure, and the static space's progress bar
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    (line,) = [line for line in lines if not line.startswith("static 07_mma D=64:")]
    assert "nothing is measured" in line
    assert any(bar.startswith("static 07_mma D=64: 100%") for bar in lines), out.stderr


@pytest.mark.parametrize("json_out", [False, True])
def test_static_search_shows_its_progress_unless_asked_for_json(capsys, monkeypatch, json_out):
    """A cold cache is minutes of nvcc: the bar goes to stderr whether or not it is a terminal
    (pytest's capture is none), as inspect's does; --json keeps stderr quiet, as inspect's does."""
    from attnlab.gpu import search

    asked = []

    def static_space(kid, D, arch, progress=False):
        asked.append(progress)
        return []
    monkeypatch.setattr(search, "static_space", static_space)
    status, _, _ = cli(capsys, "search", "--static", *(["--json"] if json_out else []))
    assert status == 0 and asked == [not json_out]


# --- check: without a GPU, --cpu; --shape; a target's tiles ----------------------------------

@pytest.mark.skipif(has_gpu(), reason="this case is about a machine without a GPU")
def test_check_without_gpu_points_to_the_cpu_run_of_the_same_kernels(capsys):
    line = refusal(*cli(capsys, "check", "07_mma")[::2])
    assert line.startswith("attnlab check: no CUDA GPU here") and "never fakes" in line
    assert "`python -m attnlab check 07_mma --cpu` runs the same kernels here" in line
    line = refusal(*cli(capsys, "check", "04_cublas_hybrid", "--quick", "--shape", "1", "2", "300", "64")[::2])
    assert "`python -m attnlab check 04_cublas_hybrid --cpu --quick --shape 1 2 300 64`" in line
    line = refusal(*cli(capsys, "sanitize", "07_mma")[::2])
    assert "check --cpu" in line and "races" in line


def test_help_says_check_runs_here_with_cpu():
    from attnlab.cli import _parser

    top = " ".join(_parser().format_help().split())
    assert "check the correctness suite on a GPU (writes a record); with --cpu, here on attnlab's CPU executor " \
           "(no GPU needed)" in top
    out = run("check", "--help")
    assert out.returncode == 0 and "--arch" in out.stdout and "--shape B H L D" in out.stdout
    assert "07_mma@sm_90" in out.stdout


@pytest.mark.parametrize("args, says", [
    (["check", "07_mma@sm_90"], "07_mma@sm_90: a target's tiles are checked on the CPU executor (add --cpu)"),
    (["check", "07_mma", "--arch", "sm_90"], "--arch sm_90 goes with --cpu"),
    (["check", "--cpu", "07_mma", "--probe"], "--probe is a GPU session's crash probe"),
    (["check", "--cpu", "07_mma@sm_100"], "07_mma@sm_100: no tiles table for sm_100"),
    (["check", "--cpu", "07_mma", "--arch", "sm_90a"], "--arch sm_90a: no tiles table for sm_90a"),
    (["check", "--cpu", "07_mma@sm90"], "07_mma@sm90: 'sm90' is not a GPU target like sm_80"),
    (["check", "--cpu", "07_mmx@sm_90"], "unknown kernel '07_mmx'; did you mean '07_mma'?"),
])
def test_check_refuses_what_it_cannot_do_in_one_line_before_any_build(capsys, monkeypatch, args, says):
    from attnlab.executor import cpu

    def never(*a, **k):
        raise AssertionError("ran a case")
    monkeypatch.setattr(cpu, "run_suite_cpu", never)
    line = refusal(*cli(capsys, *args)[::2])
    assert line.startswith("attnlab check: ") and says in line


def _spy_cpu_suite(monkeypatch):
    """check --cpu with run_suite_cpu recording what it was asked to run (and running nothing)."""
    from attnlab.executor import cpu

    calls = []

    def run_suite_cpu(specs, shapes=None, seeds=(0,), progress=True, labels=None):
        calls.append({"specs": list(specs), "shapes": shapes, "seeds": tuple(seeds), "labels": list(labels)})
        return []
    monkeypatch.setattr(cpu, "run_suite_cpu", run_suite_cpu)
    return calls


def test_check_cpu_builds_each_kernel_for_its_target_and_names_it(capsys, monkeypatch):
    from attnlab.gpus import arch_at_hand

    calls = _spy_cpu_suite(monkeypatch)
    assert cli(capsys, "check", "--cpu", "07_mma@sm_90", "07_mma", "01_scalar", "--arch", "sm_80")[0] == 0
    (call,) = calls
    assert call["labels"] == ["07_mma@sm_90", "07_mma@sm_80", "01_scalar"]
    h100, a100, scalar = call["specs"]
    assert h100.config["ATTN07_STAGES_D64"] == 3 and h100.config["ATTN07_BLOCK_N_D128"] == 64  # the H100's
    assert a100.config["ATTN07_STAGES_D64"] == 2 and a100.config["ATTN07_BLOCK_N_D128"] == 64  # the A100's
    assert scalar.id == "01_scalar" and call["shapes"] is None  # None: each kernel's cpu_shapes
    calls.clear()
    assert cli(capsys, "check", "--cpu", "07_mma", "--quick")[0] == 0
    assert calls[0]["labels"] == [f"07_mma@{arch_at_hand()[0]}"] and calls[0]["seeds"] == (0,)
    calls.clear()
    assert cli(capsys, "check", "--cpu", "07_mma@sm_89", "07_mma", "--arch", "sm_89")[0] == 0
    assert calls[0]["labels"] == ["07_mma@sm_89"]  # the same build named twice runs once


def test_check_cpu_runs_exactly_the_shapes_asked_for(capsys, monkeypatch):
    from attnlab.shapes import Shape

    calls = _spy_cpu_suite(monkeypatch)
    status, _, err = cli(capsys, "check", "--cpu", "04_cublas_hybrid", "--shape", "1", "2", "300", "64",
                         "--shape", "1", "2", "300", "64", "--shape", "1", "1", "513", "40")
    assert status == 0 and err == ""
    assert calls[0]["shapes"] == [Shape(1, 2, 300, 64), Shape(1, 1, 513, 40)]
    # a shape large for the CPU executor runs, with a note that it takes a while
    status, _, err = cli(capsys, "check", "--cpu", "01_scalar", "--shape", "2", "8", "2048", "64")
    assert status == 0 and err.startswith("note: (2, 8, 2048, 64) is large for the CPU executor")


def test_check_on_a_gpu_runs_the_shapes_asked_for_and_records_only_the_suite(capsys, monkeypatch):
    """The GPU path, its GPU and its suite stood in for: --shape replaces the suite's shapes (and
    the probe's), and a check at chosen shapes writes no record."""
    import attnlab.gpus
    from attnlab.gpu import check
    from attnlab import env
    from attnlab.records import results
    from attnlab.shapes import PROBE_SHAPES, Shape

    asked = []
    monkeypatch.setattr(env, "has_gpu", lambda: True)
    monkeypatch.setattr(attnlab.gpus, "arch_at_hand", lambda: ("sm_89", "the L4's"))
    monkeypatch.setattr(check, "run_suite", lambda specs, shapes=None, seeds=(), progress=True:
                        asked.append((shapes, tuple(seeds))) or [])

    def never(*a, **k):
        raise AssertionError("wrote a record")
    monkeypatch.setattr(results, "write_record", never)
    status, out, _ = cli(capsys, "check", "07_mma", "--shape", "1", "2", "300", "64")
    assert status == 0 and asked[-1] == ([Shape(1, 2, 300, 64)], check.CHECK_SEEDS)
    assert "record: none" in out
    status, out, _ = cli(capsys, "check", "07_mma", "--probe", "--no-record")
    assert status == 0 and asked[-1] == (PROBE_SHAPES, check.CHECK_SEEDS[:1]) and "record" not in out


def test_check_cpu_at_a_shape_past_the_softmax_step_passes_and_says_which_build(capsys):
    """The real run: chapter 4 at a row of 300 (two 256-column warp steps), and chapter 7 with the
    H100's tiles, each row labelled with the kernel (and the target, where the tiles follow it)."""
    status, out, _ = cli(capsys, "check", "--cpu", "--quick", "04_cublas_hybrid", "07_mma@sm_90",
                         "--shape", "1", "1", "300", "64")
    assert status == 0, out
    rows = [line.split()[0] for line in out.splitlines()[1:-1]]
    assert rows == ["04_cublas_hybrid"] * 2 + ["07_mma@sm_90"] * 2, out
    assert "(1, 1, 300, 64)" in out and "4/4 cases passed on the CPU executor" in out


def test_inspect_counts_each_function_s_own_sass():
    """One row per function, its own SASS: chapter 7's entries differ, and sum to the id's total."""
    from collections import Counter

    out = run("inspect", "07_mma", "--arch", "sm_89", "--json")
    assert out.returncode == 0, out.stderr
    (rep,) = json.loads(out.stdout)
    totals = [sum(f["sass"].values()) for f in rep["functions"]]
    assert len(totals) >= 4 and len(set(totals)) > 1
    assert sum((Counter(f["sass"]) for f in rep["functions"]), Counter()) == Counter(rep["sass"])
    assert all(f["sass_by_class"]["tensor core"] > 0 for f in rep["functions"])
    table = run("inspect", "07_mma", "--arch", "sm_89")
    header, *rows = table.stdout.splitlines()
    col = header.split().index("SASS") - 1  # the header's "dyn smem" is two words, a row's one number
    assert sorted(int(r.split()[col]) for r in rows) == sorted(totals), table.stdout


def test_import_evidence_of_a_missing_file_is_one_line(capsys, tmp_path):
    line = refusal(*cli(capsys, "import-evidence", str(tmp_path / "nope.tar.gz"))[::2])
    assert line == f"attnlab import-evidence: no such file: {tmp_path / 'nope.tar.gz'}"


def _no_nvcc(monkeypatch):
    from attnlab.kernels import toolchain
    from attnlab.kernels.toolchain import ToolMissing

    def missing():
        raise ToolMissing("nvcc is not in this Python environment: pip install it\nsecond line")
    monkeypatch.setattr(toolchain, "nvcc", missing)


@pytest.mark.parametrize("cmd", [["inspect", "01_scalar"], ["prebuild"]])
def test_a_missing_tool_is_one_line(capsys, monkeypatch, cmd):
    _no_nvcc(monkeypatch)
    line = refusal(*cli(capsys, *cmd)[::2])
    assert line == f"attnlab {cmd[0]}: nvcc is not in this Python environment: pip install it"


def test_a_missing_tool_in_the_static_search_is_one_line(capsys, monkeypatch):
    from attnlab.gpu import search
    from attnlab.kernels.toolchain import ToolMissing

    def missing(*args, **kwargs):
        raise ToolMissing("cuobjdump not found: pip install it")
    monkeypatch.setattr(search, "static_space", missing)
    line = refusal(*cli(capsys, "search", "--static")[::2])
    assert line == "attnlab search: cuobjdump not found: pip install it"


def test_a_compile_failure_stays_a_failure_with_its_log(capsys, monkeypatch):
    from attnlab.kernels import static, toolchain
    from attnlab.kernels.compile import KernelBuildError

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

    from attnlab.records.results import write_record

    monkeypatch.setenv("ATTNLAB_RESULTS", str(tmp_path))
    write_record(synthetic_record(kernel_us=40.0))
    status, out, _ = cli(capsys, "report")
    header, *rows = out.splitlines()
    assert status == 0
    assert header.split() == ["gpu", "kernel", "shape", "causal", "kernel", "µs", "SDPA", "SDPA", "µs", "vs",
                              "SDPA", "check"]
    assert len(rows) == 2 and all("TEST GPU" in r and "01_scalar" in r and "flash" in r for r in rows)
    assert "x0.50" in rows[0] and rows[0].endswith("pass")
