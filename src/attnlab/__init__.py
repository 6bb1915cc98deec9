"""attnlab: the helper package of the attention-kernel book.

The folders are its jobs, each a wing that imports only itself, the ground and the wings WINGS
lists for it below, never a wing above it; the ground imports no wing:

    ground     paths, env, shapes, gpus, reference, pass_rule: where files are, what machine this
               is, the named shapes, the GPUs' datasheets, the references and the pass rule
    kernels/   the registry (every kernel named once) and what turns an id into a build
    records/   what a GPU run leaves under results/, and why it can be trusted
    executor/  the kernels run and judged on the CPU, and what they did, counted
    model/     the one model that predicts a kernel's time from those counts
    gpu/       the kernels launched, checked, timed, sanitized, profiled and searched on a GPU
    session/   a lent GPU's session in stages: what it builds, carries and brings back
    book/      what the pages show: their shared steps, quotes of records, figures, teaching models
    exercises/ the reader's exercises: each skeleton's checker, run on the executor
    cli.py     `python -m attnlab`, on top of them all
    cpu.py     a reader's own kernel on the CPU executor (`run`, the `%%cuda_cpu` magic), likewise

A reader's handful: `attention` (run a registered kernel), `trace` (run one on the CPU executor
with its counts on), `get` and `KERNELS` (the registry), `Shape` and `MISSION`, and the error a bad
input raises before any launch.
"""
from .executor.trace import trace
from .gpu.launch import attention
from .kernels.contract import AttentionInputError
from .kernels.registry import KERNELS, get
from .shapes import MISSION, Shape

__all__ = ["AttentionInputError", "KERNELS", "MISSION", "Shape", "attention", "get", "trace"]

# Each wing and the wings it may import besides itself (the ground is the modules at the top of the
# package; cli.py, cpu.py and this file sit above every wing). tests/test_layout.py holds every import in
# the package to it, inside functions too, and fails on any import loop.
WINGS: dict[str, tuple[str, ...]] = {
    "ground": (),
    "kernels": ("ground",),
    "records": ("ground", "kernels"),
    "executor": ("ground", "kernels"),
    "model": ("ground", "kernels", "executor"),
    "gpu": ("ground", "kernels", "records"),
    "session": ("ground", "kernels", "records", "gpu"),
    "book": ("ground", "kernels", "records", "executor", "model", "gpu"),
    "exercises": ("ground", "kernels", "executor"),
}
