"""exercises/: the reader's exercises. Each is a small kernel with one gap, a skeleton under the
repository's exercises/ (untouched, it compiles and fails) and its solution; its checker (checkers,
on the building and launching of harness) runs the reader's file on the CPU executor at several
shapes and seeds and passes it only with the right numbers (the pass rule against the fp64
reference, or exact values), zero findings and, where banks are the point, no wavefront past the
ideal. The registry names them and judges a file in one line (`python -m attnlab exercises`).

Imports the ground and executor (kernels it may, and needs not): never records, model, gpu,
session or book.
"""
