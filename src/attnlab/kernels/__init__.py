"""kernels/: the registry, every kernel named once with its launch geometry and limits, and what
turns a kernel id into a build: its sources and their hash, the CUDA toolchain of this environment,
nvcc builds and their cache, the static inspection of a build (registers, shared memory, SASS), the
contract a launch must meet, and the split route's arithmetic. Needs no GPU.

Imports the ground only: never records, executor, model, gpu, session, book or exercises.
"""
