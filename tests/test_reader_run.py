"""A reader's own kernel on the CPU executor (attnlab.cpu, attnlab.executor.reader, `run-cpu`, the
%%cuda_cpu magic): the results are exact, a planted race and an out-of-bounds write are reported
at their lines, every wrong argument or launch is refused before any launch with one line naming
it, a compile error names the reader's file and line, and a second run of the same source builds
nothing and takes well under 2 s."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from attnlab import cli, cpu
from attnlab.executor import build as build_module
from attnlab.executor import reader, reader_commands, reader_source
from attnlab.executor.build import compiler
from attnlab.executor.library import Library
from attnlab.executor.reader_source import ReaderBuildError, ReaderError

HERE = Path(__file__).parent / "executor"
VADD = HERE / "reader_vadd.cu"
KERNELS = HERE / "reader_kernels.cu"
BROKEN = HERE / "reader_compile_error.cu"

try:
    compiler()
except Exception as exc:  # noqa: BLE001 - no g++: every test here needs one
    pytest.skip(f"the CPU executor needs a C++ compiler: {exc}", allow_module_level=True)


def vadd_inputs(n=1000):
    rng = np.random.default_rng(7)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return a, b, np.zeros(n, np.float32)


@pytest.fixture
def no_launch(monkeypatch):
    """Any launch fails the test: the refusals must come before one."""
    def launch(*args, **kwargs):
        raise AssertionError("the kernel was launched")
    monkeypatch.setattr(Library, "launch", launch)


def kinds(result):
    return {f.kind for f in result.findings}


# ---- runs ---------------------------------------------------------------------------------------

def test_vector_add_is_exact_and_updates_the_callers_array():
    a, b, c = vadd_inputs()
    a.flags.writeable = False  # a pointer-to-const parameter takes a read-only array: never copied back
    a_before = a.copy()
    result = cpu.run(VADD, grid=4, block=256, args=(a, b, c, a.size))
    assert result.clean and result.completed and result.findings == []
    assert np.array_equal(c, a + b)
    assert result["c"] is c and result.arrays[2] is c and result.names == ["a", "b", "c"]
    assert np.array_equal(a, a_before)
    text = result.summary()
    assert "vadd<<<(4, 1, 1), (256, 1, 1)>>>" in text and text.splitlines()[0].endswith("clean")
    assert str(result) == text


def test_vector_add_with_torch_tensors_in_place():
    torch = pytest.importorskip("torch")
    a = torch.arange(300, dtype=torch.float32)
    b = torch.full((300,), 0.5)
    c = torch.zeros(300)
    result = cpu.run(str(VADD), grid=2, block=256, args=(a, b, c, 300))
    assert result.clean
    assert torch.equal(c, a + b)
    assert result["c"] is c


def test_the_same_array_twice_shares_one_buffer():
    x = np.arange(64, dtype=np.float32)
    result = cpu.run(VADD, block=64, args=(x, x, x, 64))
    assert result.clean
    assert np.array_equal(x, 2 * np.arange(64, dtype=np.float32))


def test_planted_race_is_reported_at_its_lines():
    out = np.zeros(64, np.float32)
    result = cpu.run(KERNELS, "neighbour", block=64, args=(out,))
    assert not result.clean
    assert "race" in kinds(result)
    race = next(f for f in result.findings if f.kind == "race")
    assert race.where == "reader_kernels.cu:7" and race.other_where == "reader_kernels.cu:6"
    text = result.summary()
    assert "clean" not in text.splitlines()[0]
    assert "  " + race.line() in text.splitlines()
    synced = cpu.run(KERNELS, "neighbour_synced", block=64, args=(out,))
    assert synced.clean
    assert np.array_equal(out, ((np.arange(64) + 1) % 64).astype(np.float32))


def test_out_of_bounds_write_names_the_array_and_line():
    out = np.zeros(32, np.int32)
    result = cpu.run(KERNELS, "past_the_end", block=32, args=(out, 32))
    assert kinds(result) == {"global out of bounds"}
    assert result.findings[0].where == "reader_kernels.cu:40"


def test_source_string_is_named_cell_cu_in_findings():
    source = ("__global__ void oob(int* out) {\n"
              "    out[threadIdx.x + 1] = 1;\n"
              "}\n")
    result = cpu.run(source, block=8, args=(np.zeros(8, np.int32),))
    assert kinds(result) == {"global out of bounds"}
    assert result.findings[0].where == "cell.cu:2"
    named = cpu.run(source, block=8, args=(np.zeros(8, np.int32),), name="mine.cu")
    assert named.findings[0].where == "mine.cu:2"


def test_bank_conflicts_are_counted():
    one = cpu.run(KERNELS, "strided", block=32, shared_bytes=256, args=(np.zeros(32, np.float32), 1))
    two = cpu.run(KERNELS, "strided", block=32, shared_bytes=256, args=(np.zeros(32, np.float32), 2))
    assert one.clean and two.clean
    assert one.banks["ld/st"].conflict_ratio == 1.0
    # the stride-2 read is one request in two wavefronts; the two store requests are ideal
    assert (two.banks["ld/st"].requests, two.banks["ld/st"].wavefronts, two.banks["ld/st"].ideal) == (3, 4, 3)
    assert "conflict ratio 1.33" in two.summary()
    assert cpu.run(KERNELS, "strided", block=32, shared_bytes=256, args=(np.zeros(32, np.float32), 1),
                   banks=False).banks == {}


def test_printf_comes_back_as_stdout():
    out = np.zeros(64, np.int32)
    result = cpu.run(KERNELS, "hello", grid=2, block=32, args=(out,))
    assert result.clean
    assert result.stdout.splitlines() == ["hello from block 0", "hello from block 1"]
    assert "  hello from block 1" in result.summary()
    assert np.array_equal(out, np.tile(np.arange(32), 2))


def test_scalars_are_converted_to_the_parameters_types():
    x = np.ones(10, np.float32)
    result = cpu.run(KERNELS, "scale", block=32, args=(x, 3, np.uint32(10)))  # an int for a double
    assert result.clean and np.array_equal(x, np.full(10, 3, np.float32))
    flags = np.zeros(32, np.int32)
    assert cpu.run(KERNELS, "flagged", block=32, args=(flags, True)).clean
    assert np.array_equal(flags, np.full(32, 2))


def test_narrow_and_half_scalars():
    from attnlab.executor.library import _CTYPE_OF

    if not {"h", "C", "s"} <= set(_CTYPE_OF):
        pytest.skip("this executor passes no __half, unsigned char or short by value yet (thunk.h, library.py)")
    source = ("#include <cuda_fp16.h>\n"
              "__global__ void k(float* x, __half h, unsigned char c, short s) { x[0] = __half2float(h) + c + s; }\n")
    x = np.zeros(1, np.float32)
    assert cpu.run(source, block=1, args=(x, 1.5, 200, -7)).clean
    assert x[0] == 194.5
    with pytest.raises(ReaderError, match=r"^argument 3 \(c\) is 300, outside unsigned char's range 0\.\.255$"):
        cpu.run(source, block=1, args=(x, 1.5, 300, -7))


# ---- refusals, before any launch ------------------------------------------------------------------

def test_wrong_argument_count_is_refused_before_the_launch(no_launch):
    a, b, c = vadd_inputs()
    with pytest.raises(ReaderError, match=r"^vadd takes 4 arguments \(const float\* __restrict__ a, .*int n\); got 3$"):
        cpu.run(VADD, grid=4, block=256, args=(a, b, c))
    assert not c.any()


@pytest.mark.parametrize("args, message", [
    (lambda a, b, c: (a, b, c, 2.5), r"^argument 4 \(n\) is 2\.5, a float, but `int n` is an integer"),
    (lambda a, b, c: (a.astype(np.float64), b, c, 1000), r"^argument 1 \(a\) is a float64 array, .*float32"),
    (lambda a, b, c: (a, b, 3.0, 1000), r"^argument 3 \(c\) is 3\.0 \(float\), but `float\* c` is a pointer"),
    (lambda a, b, c: (a, b, list(c), 1000), r"^argument 3 \(c\) is \[.*pointer"),
    (lambda a, b, c: (a, b, c, 2**40), r"^argument 4 \(n\) is 1099511627776, outside int's range"),
    (lambda a, b, c: (a, b, c, np.zeros(3)), r"^argument 4 \(n\) is a float64 array, but `int n` is a scalar"),
    (lambda a, b, c: (a, b, np.zeros((1000, 2), np.float32)[:, 0], 1000), r"^argument 3 \(c\) is not C-contiguous"),
    (lambda a, b, c: (a, b, np.frombuffer(bytes(4000), np.float32), 1000), r"^argument 3 \(c\) is read-only"),
    (lambda a, b, c: (a[:600], a[300:900], c, 1000), r"^argument 2 \(b\) overlaps argument 1 \(a\)"),
])
def test_wrong_argument_is_named_before_the_launch(no_launch, args, message):
    a, b, c = vadd_inputs()
    with pytest.raises(ReaderError, match=message):
        cpu.run(VADD, grid=4, block=256, args=args(a, b, c))


@pytest.mark.parametrize("kwargs, message", [
    (dict(block=2000), r"^block \(2000, 1, 1\): its x must be 1\.\.1024"),
    (dict(block=(32, 32, 2)), r"^block \(32, 32, 2\): 2048 threads"),
    (dict(grid=0), r"^grid \(0, 1, 1\): its x must be 1"),
    (dict(grid=(1, 2, 3, 4)), r"^grid \(1, 2, 3, 4\): an int or a tuple of 1 to 3 ints"),
    (dict(block=2.0), r"^block 2\.0"),
    (dict(shared_bytes=300000), r"^shared_bytes 300000: dynamic shared memory is 0\.\.232448"),
])
def test_bad_launch_configuration_is_refused(no_launch, monkeypatch, kwargs, message):
    monkeypatch.setattr(reader, "build", lambda *a, **k: pytest.fail("built before the configuration was checked"))
    with pytest.raises(ReaderError, match=message):
        cpu.run(VADD, **{"args": vadd_inputs() + (1000,), **kwargs})


def test_unknown_entry_and_ambiguous_files(no_launch):
    with pytest.raises(ReaderError, match=r"no __global__ function named 'vad'; did you mean 'vadd'\?"):
        cpu.run(VADD, "vad")
    with pytest.raises(ReaderError, match=r"has 7 kernels \(neighbour, neighbour_synced, .*flagged\): name the one"):
        cpu.run(KERNELS)
    with pytest.raises(ReaderError, match=r"reader_kernels\.cu:50: templated is a template kernel.*out of scope"):
        cpu.run(KERNELS, "templated")
    overloaded = "__global__ void k(int* x) { }\n__global__ void k(float* x) { }\n"
    with pytest.raises(ReaderError, match=r"cell\.cu: k is overloaded \(lines 1, 2\)"):
        cpu.run(overloaded, "k")
    with pytest.raises(ReaderError, match="no such file"):
        cpu.run("no_such_kernel.cu")


def test_parameter_type_the_executor_cannot_pass(no_launch):
    source = "struct Pair { float x, y; };\n__global__ void k(float* out, Pair p) { out[0] = p.x; }\n"
    with pytest.raises(ReaderError, match=r"^argument 2 \(p\): `Pair p` is a parameter type the CPU executor "
                                          r"cannot pass yet \(it passes pointers, .*float, double\)$"):
        cpu.run(source, block=1, args=(np.zeros(1, np.float32), 1.0))


def test_device_function_without_a_body():
    source = "__device__ float helper(float);\n__global__ void k(float* x) { x[0] = helper(1.f); }\n"
    with pytest.raises(ReaderBuildError, match=r"helper\(float\) is used but defined nowhere"):
        cpu.run(source, block=1, args=(np.zeros(1, np.float32),))


def test_compile_error_names_the_readers_file_and_line():
    with pytest.raises(ReaderBuildError) as info:
        cpu.run(BROKEN, block=1, args=(np.zeros(1, np.float32),))
    first, *rest = str(info.value).splitlines()
    assert isinstance(info.value, ValueError)
    assert first.startswith("compiling reader_compile_error.cu for the CPU executor failed: ")
    assert "reader_compile_error.cu:5:" in first and "error" in first and "y" in first
    assert any("out[i] += y;" in line for line in rest)
    assert "attnlab-cpu-" not in str(info.value) and str(build_module.INCLUDE) not in first


def test_parameters_are_read_from_the_source():
    (k,) = reader_source.find_kernels('extern "C" __global__ void __launch_bounds__(128)\n'
                               "  f(const half* __restrict__ q, float* out /* , int x */, unsigned n,\n"
                               "    float tab[], int) { }")
    assert k.name == "f" and k.line == 1 and k.defined and not k.template
    assert [p.name for p in k.params] == ["q", "out", "n", "tab", "arg5"]
    assert [(p.pointer, p.const_pointee, p.pointee) for p in k.params] == [
        (True, True, "half"), (True, False, "float"), (False, False, ""), (True, False, "float"), (False, False, "")]


# ---- speed: one build, then the cache ----------------------------------------------------------------

def test_second_run_builds_nothing_and_is_fast(monkeypatch):
    a, b, c = vadd_inputs(256)
    first = cpu.run(VADD, block=256, args=(a, b, c, 256))
    monkeypatch.setattr(build_module, "_run", lambda *x, **k: pytest.fail("the compiler ran again"))
    c[:] = 0
    start = time.perf_counter()
    second = cpu.run(VADD, block=256, args=(a, b, c, 256))
    elapsed = time.perf_counter() - start
    assert second.clean and second.library == first.library
    assert np.array_equal(c, a + b)
    assert elapsed < 2.0, f"a warm run took {elapsed:.2f} s"


# ---- run-cpu ---------------------------------------------------------------------------------------

VADD_ARGS = ["--arg", "arange:float32:1000", "--arg", "ones:float32:1000", "--arg", "zeros:float32:1000",
             "--arg", "1000"]


def test_cli_runs_a_file_and_prints_the_arrays(capsys):
    assert cli.main(["run-cpu", str(VADD), "--grid", "4", "--block", "256", *VADD_ARGS]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("clean")
    assert "c (float32[1000]): [1, 2, 3, 4, 5, 6, 7, 8, ... (1000 elements)]" in out


def test_cli_exit_status_is_one_with_findings(capsys):
    assert cli.main(["run-cpu", str(KERNELS), "--entry", "neighbour", "--block", "64",
                     "--arg", "zeros:float32:64"]) == 1
    assert "race: " in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--block", "2000", *VADD_ARGS], "block (2000, 1, 1): its x must be 1..1024"),
    (["--block", "x", *VADD_ARGS], "--block x: X[,Y[,Z]]"),
    (["--arg", "zeros:float33:8"], "'float33' is not a NumPy number type"),
    (VADD_ARGS[:-2], "vadd takes 4 arguments"),
    (["--entry", "nope"], "no __global__ function named 'nope'"),
])
def test_cli_usage_errors_are_one_line_and_exit_two(capsys, argv, message):
    assert cli.main(["run-cpu", str(VADD), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab run-cpu: ") and message in err and err.count("\n") == 1


def test_cli_compile_error(capsys):
    assert cli.main(["run-cpu", str(BROKEN)]) == 2
    err = capsys.readouterr().err
    assert "reader_compile_error.cu:5:" in err.splitlines()[0]


def test_cli_as_a_process():
    out = subprocess.run([sys.executable, "-m", "attnlab", "run-cpu", str(VADD), "--grid", "4,1", "--block", "256",
                          *VADD_ARGS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout and "c (float32[1000])" in out.stdout


def test_arg_specs():
    rng = np.random.default_rng(0)
    assert reader_commands.parse_arg("256", rng) == 256 and reader_commands.parse_arg("-3", rng) == -3
    assert reader_commands.parse_arg("0x10", rng) == 16 and reader_commands.parse_arg("1e-3", rng) == 0.001
    r = reader_commands.parse_arg("rand:float16:64x64", rng)
    assert r.dtype == np.float16 and r.shape == (64, 64) and 0 <= r.min() and r.max() < 1
    again = reader_commands.parse_arg("rand:float16:64x64", np.random.default_rng(0))
    assert np.array_equal(r, again)  # seeded
    assert np.array_equal(reader_commands.parse_arg("arange:int32:5", rng), np.arange(5, dtype=np.int32))
    assert np.array_equal(reader_commands.parse_arg("full:float:3:2.5", rng), np.full(3, 2.5, np.float32))
    assert reader_commands.parse_arg("zeros:half:2x3", rng).dtype == np.float16
    for bad in ("zeros:float32", "rand:float32:8x", "ones:str:4", "many:int32:4", "abc"):
        with pytest.raises(ReaderError, match=rf"^--arg {bad}: "):
            reader_commands.parse_arg(bad, rng)
    assert reader_commands.parse_dims("grid", "4,2") == (4, 2) and reader_commands.parse_dims("block", "16x16") == (16, 16)


# ---- %%cuda_cpu ---------------------------------------------------------------------------------------

def test_magic_line_parsing():
    a, b, c = vadd_inputs()
    ns = {"a": a, "b": b, "c": c, "n": 1000, "blocks": (4, 1)}
    opts = reader_commands.parse_magic_line("vadd --grid blocks --block 256 --args a b c n --seed 3 --shared 0", ns)
    assert opts["entry"] == "vadd" and opts["grid"] == (4, 1, 1) and opts["block"] == (256,)
    assert opts["args"][0] is a and opts["args"][3] == 1000 and opts["seed"] == 3 and opts["shared_bytes"] == 0
    opts = reader_commands.parse_magic_line("--grid 2,2 --args a 7 -1.5 True", ns)
    assert opts["entry"] is None and opts["grid"] == (2, 2) and opts["args"][1:] == (7, -1.5, True)
    with pytest.raises(ReaderError, match=r"--args: 'd' is not defined in your namespace"):
        reader_commands.parse_magic_line("vadd --args a b d n", ns)
    with pytest.raises(ReaderError, match=r"%%cuda_cpu: unrecognized arguments: --blok"):
        reader_commands.parse_magic_line("vadd --blok 32", ns)
    with pytest.raises(ReaderError, match=r"^block \(2048, 1, 1\): its x must be 1\.\.1024"):
        reader_commands.parse_magic_line("vadd --block 2048", ns)


def test_magic_cell_runs_and_keeps_the_result(capsys):
    a, b, c = vadd_inputs()
    ns = {"a": a, "b": b, "c": c}
    result = reader_commands.run_cell("--grid 4 --block 256 --args a b c 1000", VADD.read_text(), ns)
    assert ns["_cuda_cpu"] is result and result.clean and np.array_equal(c, a + b)
    assert capsys.readouterr().out.splitlines()[0] == \
        "cell.cu: vadd<<<(4, 1, 1), (256, 1, 1)>>> on the CPU executor (schedule seed 0): clean"


def test_magic_findings_number_lines_as_jupyterlab_does(capsys):
    """The magic's own line is the cell's line 1: the kernel's lines are numbered from 2."""
    cell = "__global__ void k(float* x) {\n    x[threadIdx.x + 1] = 1.f;\n}\n"
    result = reader_commands.run_cell("--block 32 --args x", cell, {"x": np.zeros(32, np.float32)})
    assert {f.where for f in result.findings} == {"cell.cu:3"}


def test_a_torch_tensor_of_the_wrong_dtype_gets_torch_advice(no_launch):
    import torch

    with pytest.raises(ReaderError, match=r"convert it \(\.to\(torch\.float32\)\)"):
        cpu.run(VADD, grid=1, block=32, args=(torch.zeros(32, dtype=torch.float16), np.zeros(32, np.float32),
                                               np.zeros(32, np.float32), 32))


def test_magic_registers_in_ipython(capsys):
    try:
        from IPython.core.error import UsageError
        from IPython.core.interactiveshell import InteractiveShell
    except ImportError:
        pytest.skip("IPython is not installed in this environment (the magic's parsing is tested without it)")
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "attnlab.cpu")
    a, b, c = vadd_inputs()
    ip.user_ns.update(a=a, b=b, c=c, n=1000)
    ip.run_cell_magic("cuda_cpu", "vadd --grid {(n + 255) // 256} --block 256 --args a b c n", VADD.read_text())
    assert ip.user_ns["_cuda_cpu"].clean and np.array_equal(c, a + b)
    assert "clean" in capsys.readouterr().out
    with pytest.raises(UsageError, match="no __global__ function named 'vad'"):
        ip.run_cell_magic("cuda_cpu", "vad --args a b c n", VADD.read_text())


def test_importing_attnlab_cpu_loads_no_executor():
    code = "import sys, attnlab.cpu; print('attnlab.executor.reader' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.parametrize("body, named", [
    ('asm volatile("bar.sync 0;");', "inline PTX (asm)"),
    ("int n = __syncthreads_count(x[0] > 0);", "__syncthreads_count/and/or"),
    ("long long t = clock64();", "a GPU clock"),
    ("float v = tex1Dfetch<float>(0, 3);", "textures and surfaces"),
    ("float* p = (float*)malloc(64);", "a device heap (malloc, free, new, delete)"),
    ("float* p = new float[16];", "a device heap (malloc, free, new, delete)"),
])
def test_what_the_executor_cannot_run_is_refused_by_name_before_any_build(monkeypatch, body, named):
    monkeypatch.setattr(reader_source, "load", lambda *a, **k: pytest.fail("built what it cannot run"))
    source = "__global__ void k(float* x) {\n    " + body + "\n}\n"
    with pytest.raises(ReaderError) as err:
        cpu.run(source, block=32, args=(np.zeros(32, np.float32),))
    assert str(err.value).startswith(f"cell.cu:2: {named} is not something the CPU executor runs")
    # A mention in a comment is not a use.
    assert reader_source.unsupported("// no asm here, no clock64()\n", "c.cu") is None


@pytest.mark.parametrize("declaration, named", [
    ("__device__ float coef[4] = {1.f, 2.f, 3.f, 4.f};", "a __device__ (or __managed__) variable"),
    ("static __device__ int counter;", "a __device__ (or __managed__) variable"),
    ("__managed__ int flag;", "a __device__ (or __managed__) variable"),
    ("__constant__ float scale[4];", "__constant__ memory"),
])
def test_global_variables_are_refused_by_name_and_const_tables_run(monkeypatch, declaration, named):
    """A `__device__` variable would be host memory the executor does not watch (its accesses were
    reported against another buffer): refused. A const table with its values in the source, and a
    `__device__` function, are plain C++ and run."""
    body = "__global__ void k(float* x) {\n    x[threadIdx.x] *= 2.f;\n}\n"
    with pytest.raises(ReaderError) as err:
        cpu.run(declaration + "\n" + body, block=32, args=(np.zeros(32, np.float32),))
    assert str(err.value).startswith(f"cell.cu:1: {named} is not something the CPU executor runs")
    x = np.ones(32, np.float32)
    table = ("__device__ const float coef[4] = {1.f, 2.f, 3.f, 4.f};\n"
             "__device__ float scaled(int i) { return coef[i % 4]; }\n"
             "__global__ void k(float* x) {\n    x[threadIdx.x] *= scaled(threadIdx.x);\n}\n")
    result = cpu.run(table, block=32, args=(x,))
    assert result.clean and np.array_equal(x, np.tile([1, 2, 3, 4], 8).astype(np.float32))
