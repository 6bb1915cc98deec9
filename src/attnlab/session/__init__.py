"""session/: a lent GPU's session in stages that each fit one short call (stages): the nvcc builds
it needs (prebuild), what travels with the working tree and the proof that it fits (carry), and the
archives it brings back, taken into this checkout only when they hold (evidence).

Imports the ground, kernels, records and gpu only: never executor, model, book or exercises.
"""
