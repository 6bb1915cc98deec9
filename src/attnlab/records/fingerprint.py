"""Everything that decides a recorded number, fingerprinted, so a record goes stale exactly when
one of its inputs changes.

Per kernel of a record:
- `sha256`: the kernel's source and headers (attnlab.kernels.sources.kernel_hash). Where only this
  differs, the two versions are compiled and compared function by function (attnlab.records.code):
  an edit that leaves the code the record ran as it was (a comment, a new entry) keeps it fresh;
- `build`: how its binary was made: back end, compiler and version, flags, target, defines;
- `launch_sha256`: the launch geometry it ran with (grid, block, dynamic shared memory, entry, key
  split) at every shape and configuration the record holds, on the record's GPU;
- `runner`: the Python module that launches it, where one does (chapters 4 and 7's split route).
Per record, `harness`: the sha256 of each module that times, checks and compares for its kind.

Source and harness hashes are of files, so they can be recomputed from a commit's tree
(attnlab.records.provenance) as well as from the working tree; build and launch are recomputed from the
code as it is now, for the record's GPU.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import posixpath
from typing import Callable

from ..shapes import Shape

# The modules that time, check and compare, per kind of record: editing one makes that kind's
# records stale. compile.py is not among them: what it decides is the `build` fingerprint.
HARNESS = {
    "bench": ("gpu.bench", "records.timing", "gpu.check", "pass_rule", "reference", "gpu.launch", "kernels.contract",
              "gpu.triton_ref", "shapes"),
    "check": ("gpu.check", "pass_rule", "reference", "gpu.launch", "kernels.contract", "shapes"),
    "sanitize": ("gpu.sanitize", "gpu.launch", "kernels.contract", "pass_rule", "shapes"),
    "search": ("gpu.search", "gpu.bench", "records.timing", "pass_rule", "reference", "gpu.launch", "kernels.contract"),
    "profile": ("gpu.profile", "pass_rule", "gpu.launch", "kernels.contract"),
}


def module_path(module: str) -> str:
    """src/attnlab/<wing>/<module>.py (or src/attnlab/<module>.py for the ground) of a module named
    as under attnlab ("gpu.bench"), relative to the repository."""
    return f"src/attnlab/{module.replace('.', '/')}.py"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def runner_module(spec) -> str | None:
    """The attnlab module that launches `spec` around its kernel ("gpu.hybrid"), or None."""
    if spec.runner is None:
        return None
    return spec.runner.partition(":")[0].removeprefix("attnlab.")


def harness_modules(kind: str, specs) -> list[str]:
    runners = [m for m in (runner_module(s) for s in specs) if m]
    return list(dict.fromkeys([*HARNESS[kind], *runners]))


def harness_digests(modules, read: Callable[[str], bytes | None]) -> dict[str, str | None]:
    """Module -> sha256 of its file as `read` gives it (None where the file does not exist)."""
    out = {}
    for m in modules:
        data = read(module_path(m))
        out[m] = None if data is None else sha(data)
    return out


def source_digests(spec, read: Callable[[str], bytes | None]):
    """The kernel_hashes `spec`'s files may have had as `read` gives them (a commit's, say): over its
    source and every header first, then over its source and fewer of its headers, in their order,
    since a header may have joined the spec after the commit (a new `#include`). The headers are the
    spec's and, after them, any the source `read` gives includes that the spec no longer names (an
    `#include` removed since). Each digest binds the contents of files that `read` holds; none where
    the source itself is missing."""
    from ..kernels.sources import digest_named
    from .code import files_of

    data = files_of(spec, read)  # the source first, then its headers
    source, *rels = data
    if data[source] is None:
        return
    headers = [rel for rel in rels if data[rel] is not None]
    for n in range(len(headers), -1, -1):
        for chosen in itertools.combinations(headers, n):
            yield digest_named((posixpath.basename(rel), data[rel]) for rel in (source, *chosen))


def toolchain_now() -> tuple[str, str]:
    """(back end, compiler and version) that builds kernels here now."""
    from ..kernels import compile as build
    from ..kernels import toolchain

    which = build.backend()
    if which == "nvcc":
        return which, f"nvcc {toolchain.nvcc_version()}"
    try:
        import cupy
        major, minor = cupy.cuda.nvrtc.getVersion()
        return which, f"nvrtc {major}.{minor}"
    except Exception:  # noqa: BLE001 - CuPy missing or without NVRTC: the back end is all we know
        return which, "nvrtc"


def release(compiler: str) -> str:
    """"nvcc 13.0" of "nvcc 13.0.88": what freshness compares. A GPU machine's image and this
    environment's wheel may carry different patch builds of one CUDA release (the one the GPU
    hosts' driver takes, toolchain.GPU_HOST_CUDA); a record names the full version it was built
    with, and goes stale when the release changes."""
    name, _, version = str(compiler).partition(" ")
    return f"{name} {'.'.join(version.split('.')[:2])}".strip()


def build_of(spec, arch: str) -> dict:
    """How `spec` (already built for `arch`) is compiled here now."""
    from ..kernels.compile import NVCC_FLAGS

    backend, compiler = toolchain_now()
    return {"backend": backend, "compiler": compiler, "flags": list(NVCC_FLAGS), "arch": arch,
            "defines": [[n, v] for n, v in spec.defines]}


def launch_digest(spec, launches, sms: int) -> str:
    """sha256 of the launch geometry of `spec` at each (configuration or None, shape) of
    `launches`, on a GPU of `sms` SMs."""
    seen = []
    for config, shape in launches:
        built = spec.with_config(config) if config else spec
        if not built.supports_head_dim(shape.D):
            seen.append([config, list(shape), "unsupported"])
            continue
        cfg = built.launch_config(shape, sms=sms)
        seen.append([config, list(shape), {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}])
    return sha(json.dumps(seen, sort_keys=True).encode())


def launches_of(rec: dict, kernel_id: str) -> list[tuple[dict | None, Shape]]:
    """Every (configuration, shape) at which a record ran `kernel_id`, in a fixed order."""
    kind, out = rec["kind"], []
    if kind == "bench":
        out = [(None, Shape(*c["shape"])) for c in rec["cases"] if kernel_id in c["kernels"]]
    elif kind == "sanitize":
        from ..shapes import SANITIZE_SHAPES
        out = [(None, s) for s in SANITIZE_SHAPES]
    elif kind == "search":
        out = [(c["config"], Shape(*c["shape"])) for c in rec["cases"]
               if c["kernel"] == kernel_id and c.get("status") != "static"]
    else:  # check, profile
        out = [(None, Shape(*c["shape"])) for c in rec["cases"] if c["kernel"] == kernel_id]
    unique = {json.dumps([cfg, list(s)], sort_keys=True): (cfg, s) for cfg, s in out}
    return [unique[k] for k in sorted(unique)]


def arch_of(gpu: dict) -> str:
    """sm_XY of a record's GPU ("9.0" -> sm_90)."""
    return "sm_" + str(gpu["compute_capability"]).replace(".", "")
