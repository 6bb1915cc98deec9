"""executor/: the chapters' .cu files compiled with a C++ compiler and run on the CPU, with the
threads of each block as fibers, warp-collective operations and cp.async as the PTX ISA specifies
them, and the checks a sanitizer makes (races, out-of-bounds, uninitialized and early reads,
deadlocks, barrier and mask misuse); the registered kernels checked there by the GPU's pass rule
(cpu), and the planted mistakes that check must catch (mutants, mutation). It never times.

Imports the ground and kernels only: never records, model, gpu, session, book or exercises.
"""
