"""gpu/: the kernels on a CUDA GPU: launched (launch, and the runners of chapters 4 and 7), checked
against the references, timed next to every SDPA backend and the Triton reference, run under
compute-sanitizer and Nsight Compute, and searched over their knobs; each run writes a record.

Imports the ground, kernels and records only: never executor, model, session, book or exercises.
"""
