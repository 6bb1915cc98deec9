"""model/: the one model that predicts a kernel's time on a GPU from what the CPU executor counted
(bounds): the time each resource needs for the counted work at the GPU's rates, the largest of
them the prediction and its name the bottleneck. A prediction is never a measurement: it never
enters a record, and every number it shows says "predicted". issue weighs the SASS a CTA issues by
those counts; weigh sets a kernel edit's predictions beside the kernels' own before it becomes a step.

Imports the ground, kernels and executor only: never records, gpu, session, book or exercises.
"""
