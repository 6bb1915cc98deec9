"""A reader's kernel never hangs or takes the process down, and what CUDA allows it runs: a loop
that touches no memory stops at the time limit and a SIGINT stops a launch at once (the
watchdog), a misaligned vector access is a finding and stops the launch as a GPU's fault does
(the host's aligned move would have crashed), memset/memcpy/memmove of any size are checked like
the loads and stores they stand for, printf after #include <cstdio> is still captured, 8- and
16-bit values shuffle, and a frame larger than a fiber's stack fails the build, naming it."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from attnlab import cpu
from attnlab.executor.build import compiler
from attnlab.executor.reader_source import ReaderBuildError

try:
    compiler()
except Exception as exc:  # noqa: BLE001 - no g++: every test here needs one
    pytest.skip(f"the CPU executor needs a C++ compiler: {exc}", allow_module_level=True)

SPIN = """
__global__ void spin(int* y, int forever) {
    int i = 0;
    while (forever) { ++i; }
    y[threadIdx.x] = i;
}
__global__ void wait_flag(int* y) {
    while (y[0] == 0) {}      // a non-volatile flag: the load leaves the loop, a jump to itself stays
    y[threadIdx.x] = 1;
}
"""


@pytest.mark.parametrize("entry, args", [("spin", 1), ("wait_flag", None)])
def test_a_loop_that_touches_no_memory_stops_at_the_time_limit_at_its_line(entry, args):
    y = np.zeros(32, np.int32)
    start = time.monotonic()
    result = cpu.run(SPIN, entry, block=32, args=(y,) if args is None else (y, args), time_limit=1.0)
    assert time.monotonic() - start < 30
    assert not result.completed
    (finding,) = result.findings
    assert finding.kind == "timeout" and "endless loop" in finding.message
    assert finding.where == ("cell.cu:4" if entry == "spin" else "cell.cu:8")
    # The same kernel that ends runs clean afterwards: the stopped launch left nothing behind.
    done = cpu.run(SPIN, "spin", block=32, args=(np.zeros(32, np.int32), 0))
    assert done.clean


def test_an_interrupt_stops_a_launch_and_raises_keyboard_interrupt():
    code = textwrap.dedent(f"""
        import time, numpy as np
        from attnlab import cpu
        src = {SPIN!r}
        cpu.run(src, "spin", block=32, args=(np.zeros(32, np.int32), 0))
        print("ready", flush=True)
        start = time.monotonic()
        try:
            cpu.run(src, "spin", block=32, args=(np.zeros(32, np.int32), 1), time_limit=120)
            print("returned")
        except KeyboardInterrupt:
            print(f"interrupted after {{time.monotonic() - start:.1f}} s")
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.startswith("interrupted after"), (out, err)
    assert float(out.split()[2]) < 10


MISALIGNED = """
__global__ void copy16(const unsigned char* in, uint4* out, int shift) {
    __shared__ __align__(16) unsigned char bytes[1024];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) bytes[i] = in[i];
    __syncthreads();
    out[threadIdx.x] = *reinterpret_cast<const uint4*>(bytes + 16 * threadIdx.x + shift);
}
"""


def test_a_misaligned_vector_access_is_a_finding_that_stops_the_launch():
    data = np.arange(1024).astype(np.uint8)
    out = np.zeros((32, 4), np.uint32)
    assert cpu.run(MISALIGNED, block=32, args=(data, out, 0)).clean
    assert np.array_equal(out.view(np.uint8).ravel()[:512], data[:512])
    result = cpu.run(MISALIGNED, block=32, args=(data, np.zeros((32, 4), np.uint32), 4))
    assert not result.completed
    (finding,) = result.findings
    assert finding.kind == "misaligned access" and finding.where == "cell.cu:6"
    assert "reads 16 bytes at bytes[" in finding.message and "not 16-byte aligned" in finding.message


BYTES = """
#include <cstring>
__global__ void fill(float* y, int n, int mode) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    if (mode == 0 && t == 0) memset(y + 124, 0, n);          // past the end for n > 16
    if (mode == 1) {                                        // one thread clears, all read after
        if (t == 0) memset(s, 0, sizeof(s));
        __syncthreads();
        y[t] = s[t] + 1.f;
    }
    if (mode == 2) memset(y, t, n);                          // every thread the same bytes: a race
    if (mode == 3 && t == 0) memcpy(y + 100, y, n);          // past the end for n > 112
    if (mode == 4 && t == 0) memmove(y + 1, y, n);
}
"""


@pytest.mark.parametrize("mode, n, kind, line", [
    (0, 32, "global out of bounds", 6), (2, 16, "race", 12), (3, 200, "global out of bounds", 13),
])
def test_memset_and_memcpy_of_any_size_are_checked(mode, n, kind, line):
    result = cpu.run(BYTES, block=64, args=(np.zeros(128, np.float32), n, mode))
    assert kind in {f.kind for f in result.findings}, result
    assert all(f.where == f"cell.cu:{line}" for f in result.findings if f.kind == kind)


def test_memset_and_memmove_write_what_they_say_and_are_clean():
    y = np.zeros(128, np.float32)
    assert cpu.run(BYTES, block=64, args=(y, 0, 1)).clean  # the cleared tile counts as written
    assert np.array_equal(y[:64], np.ones(64, np.float32))
    y = np.arange(128, dtype=np.float32)
    assert cpu.run(BYTES, block=64, args=(y, 40, 4)).clean
    assert np.array_equal(y[1:11], np.arange(10, dtype=np.float32))


def test_printf_after_including_cstdio_is_captured():
    source = ('#include <cstdio>\n#include <stdio.h>\n'
              '__global__ void hello(int* o) { if (threadIdx.x < 2) printf("hi %d\\n", threadIdx.x); o[threadIdx.x] = 1; }\n')
    result = cpu.run(source, block=32, args=(np.zeros(32, np.int32),))
    assert sorted(result.stdout.splitlines()) == ["hi 0", "hi 1"]


def test_eight_and_sixteen_bit_values_shuffle():
    source = """
#include <cuda_fp16.h>
__global__ void narrow(const __half* h, __half* ho, short* s, signed char* c) {
    const int t = threadIdx.x;
    ho[t] = __shfl_xor_sync(0xffffffffu, h[t], 1);
    const short sv = __shfl_down_sync(0xffffffffu, s[t], 1);
    const signed char cv = __shfl_sync(0xffffffffu, c[t], 31 - t);
    __syncwarp();
    s[t] = sv;
    c[t] = cv;
}
"""
    h = np.arange(32).astype(np.float16)
    ho = np.zeros(32, np.float16)
    s = (np.arange(32) - 16).astype(np.int16)
    c = (np.arange(32) - 16).astype(np.int8)
    result = cpu.run(source, block=32, args=(h, ho, s, c))
    assert result.clean, result
    assert np.array_equal(ho, np.arange(32).reshape(16, 2)[:, ::-1].ravel().astype(np.float16))
    assert np.array_equal(s[:31], (np.arange(1, 32) - 16).astype(np.int16))
    assert np.array_equal(c, (15 - np.arange(32)).astype(np.int8))


def test_a_frame_larger_than_a_fibers_stack_fails_the_build_naming_it():
    source = ("__global__ void big(float* y) {\n    float acc[65536];\n"
              "    for (int k = 0; k < 65536; ++k) acc[k] = k * y[0];\n    y[threadIdx.x] = acc[threadIdx.x];\n}\n")
    with pytest.raises(ReaderBuildError) as err:
        cpu.run(source, block=32, args=(np.ones(32, np.float32),))
    assert "frame size" in str(err.value).splitlines()[0]
