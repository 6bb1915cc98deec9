"""Five 64-thread kernels that hand shared memory from one warp to another, for compute-sanitizer's
racecheck (tests/test_gpu_racecheck.py): warp 0 writes, warp 1 reads, ordered by nothing, by
bar.sync on both sides, by the producer's bar.arrive (chapter 6's full barrier), by cp.async then
bar.arrive, and a ring whose consumer releases the buffer with bar.arrive before the producer
refills it (chapter 6's empty barrier). Run as `python named_barrier_handoff.py KERNEL`; it prints
whether the output is right."""
import sys

import cupy as cp

SOURCE = r'''
#define ARRIVE(id) asm volatile("bar.arrive %0, 64;" :: "n"(id) : "memory")
#define SYNC(id)   asm volatile("bar.sync %0, 64;" :: "n"(id) : "memory")

extern "C" __global__ void no_barrier(const float* in, float* out) {
  __shared__ float buf[64]; int t = threadIdx.x;
  if (t < 32) { buf[t] = in[t]; buf[t + 32] = in[t + 32]; }
  else { out[t - 32] = buf[t - 32] + buf[t]; }
}
extern "C" __global__ void sync_both(const float* in, float* out) {
  __shared__ float buf[64]; int t = threadIdx.x;
  if (t < 32) { buf[t] = in[t]; buf[t + 32] = in[t + 32]; SYNC(1); }
  else { SYNC(1); out[t - 32] = buf[t - 32] + buf[t]; }
}
extern "C" __global__ void producer_arrives(const float* in, float* out) {
  __shared__ float buf[64]; int t = threadIdx.x;
  if (t < 32) { buf[t] = in[t]; buf[t + 32] = in[t + 32]; ARRIVE(1); }
  else { SYNC(1); out[t - 32] = buf[t - 32] + buf[t]; }
}
extern "C" __global__ void cp_async_then_arrive(const float* in, float* out) {
  __shared__ __align__(16) float buf[64]; int t = threadIdx.x;
  if (t < 16) {
    unsigned s = (unsigned)__cvta_generic_to_shared(buf + 4 * t);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" :: "r"(s), "l"(in + 4 * t) : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  }
  if (t < 32) ARRIVE(1);
  else { SYNC(1); out[t - 32] = buf[t - 32] + buf[t]; }
}
extern "C" __global__ void consumer_releases(const float* in, float* out) {
  __shared__ float buf[32]; int t = threadIdx.x; float x = 0.f;
  for (int round = 0; round < 2; ++round) {
    if (t < 32) { if (round) SYNC(2); buf[t] = in[t + 32 * round]; ARRIVE(1); }
    else { SYNC(1); x += buf[t - 32]; if (round == 0) ARRIVE(2); }
  }
  if (t >= 32) out[t - 32] = x;
}
'''
KERNELS = ("no_barrier", "sync_both", "producer_arrives", "cp_async_then_arrive", "consumer_releases")

if __name__ == "__main__":
    name = sys.argv[1]
    fn = cp.RawModule(code=SOURCE, options=("-std=c++17",)).get_function(name)
    inp = cp.arange(64, dtype=cp.float32)
    out = cp.zeros(32, dtype=cp.float32)
    fn((1,), (64,), (inp, out))
    cp.cuda.runtime.deviceSynchronize()
    right = bool(cp.allclose(out, cp.arange(32) + cp.arange(32, 64)))
    print(f"{name}: output {'right' if right else 'WRONG'}")
