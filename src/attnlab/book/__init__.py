"""book/: what the pages show: the steps every chapter shares (page), what a page quotes and draws
from a record (measured, plot, scoreboard), what it shows of a kernel's source and binary
(kernel_view), what the CPU executor counted and traced (executor_view), the time model's
predictions, labelled (predicted), and the teaching figures and models of single chapters (banks,
fragments, swizzle, ring, split_merge, hybrid_model).

Imports the ground, kernels, records, executor, model and gpu (a page runs and reads all of them):
never session or exercises (a page lists the exercises from their folder, not their checkers).
"""
