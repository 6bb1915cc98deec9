"""records/: what a GPU run leaves under results/ and why it can be trusted: records written with
their provenance (commit and tree), the fingerprint of everything that decides a number, the
timing statistics they keep, and the physics no real GPU can break.

Imports the ground and kernels only: never executor, model, gpu, session, book or exercises.
"""
