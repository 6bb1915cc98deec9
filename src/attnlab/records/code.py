"""Whether a kernel whose source changed since a record still compiles to the code the record ran.

A record's kernel is fingerprinted by its source file and headers (fingerprint.source_digest), and
any edit to them changes that digest: a comment, a new entry beside the measured ones, a switch
whose other setting only a new step takes. What decides a measured number is narrower: the machine
code of the functions the GPU ran. So where only compiled files changed, both versions are built
here with one compiler, flags and target, and the record's kernel stays fresh exactly when every
function of the record's binary is in today's, instruction for instruction (encodings and control
codes, with their stalls and barriers) and with the same resources (registers, shared memory,
stack, spills). A new function beside them changes nothing the record ran; the launch fingerprint
says which entries are launched now.

Each build's digests are cached on disk by everything that decides them (the files, the
configuration, target, flags and the versions of nvcc and cuobjdump), and per process.
"""
from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

COMPILED = (".cu", ".cuh", ".h")  # a change anywhere else (a runner module) is not judged by the binary
_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")


def source_files(spec) -> list[str]:
    """The repository paths of `spec`'s source and headers, as fingerprint.source_digest names them."""
    return [posixpath.normpath(f"kernels/{name}") for name in (spec.source, *spec.extra_sources)]


def function_digests(sass: str, ptxas: str) -> dict[str, str]:
    """sha256 of each function of a cuobjdump -sass listing: its every line (instructions and their
    encodings) and ptxas's resources of it."""
    from ..kernels.static import parse_ptxas

    blocks: dict[str, list[str]] = {}
    current = None
    for line in sass.splitlines():
        if m := _FUNCTION.match(line):
            current = m.group(1)
            blocks[current] = []
        elif current is not None:
            blocks[current].append(line.rstrip())
    resources = {f.name: json.dumps(vars(f), sort_keys=True) for f in parse_ptxas(ptxas)}
    return {name: hashlib.sha256("\n".join([*lines, resources.get(name, "")]).encode()).hexdigest()
            for name, lines in blocks.items()}


def _key(files: tuple[tuple[str, bytes], ...], main: str, defines: tuple, arch: str) -> str:
    from ..kernels import toolchain
    from ..kernels.compile import NVCC_FLAGS

    h = hashlib.sha256()
    for rel, data in files:
        h.update(rel.encode() + b"\0" + data + b"\0")
    h.update(json.dumps([main, list(defines), arch, list(NVCC_FLAGS), toolchain.nvcc_version(),
                         toolchain.cuobjdump_version()]).encode())
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def code_of(files: tuple[tuple[str, bytes], ...], main: str, defines: tuple, arch: str) -> dict[str, str]:
    """Function -> digest (function_digests) of `main` built for `arch` with `defines` from `files`
    ((repository path, contents), ...: the source and its headers, laid out as in the repository).
    Raises ToolMissing without nvcc or cuobjdump, KernelBuildError where nvcc rejects the files."""
    from ..kernels import toolchain
    from ..kernels.compile import NVCC_FLAGS, KernelBuildError, define_flags, write_atomic
    from ..paths import cache_dir

    cached = cache_dir() / "code" / f"{_key(files, main, defines, arch)[:32]}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    with tempfile.TemporaryDirectory(prefix="attnlab-code-") as tmp:
        for rel, data in files:
            path = Path(tmp, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        cubin = Path(tmp, "out.cubin")
        cmd = [toolchain.nvcc(), f"-arch={arch}", "-cubin", "-Xptxas", "-v", *NVCC_FLAGS, *define_flags(defines),
               "-I", str(Path(tmp, "kernels")), "-o", str(cubin), str(Path(tmp, main))]
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            raise KernelBuildError(f"nvcc failed for {main} ({arch}):\n{built.stderr[-2000:]}")
        listed = subprocess.run([toolchain.cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True)
        if listed.returncode != 0:
            raise KernelBuildError(f"cuobjdump failed for {main} ({arch}): {listed.stderr[-500:]}")
        digests = function_digests(listed.stdout, built.stderr)
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cached, json.dumps(digests, sort_keys=True))
    return digests


def changed_code(spec, arch: str, then: Callable[[str], bytes | None], now: Callable[[str], bytes | None]) -> str | None:
    """None when `spec` built for `arch` from the files `then` gives (a commit's) has every function,
    code and resources alike, in its build from the files `now` gives; else why not, in words."""
    from ..kernels.compile import KernelBuildError
    from ..kernels.toolchain import ToolMissing

    rels = source_files(spec)
    old, new = {r: then(r) for r in rels}, {r: now(r) for r in rels}
    if any(data is None for data in (*old.values(), *new.values())):
        return "a source file is missing at one of the two commits"
    outside = [r for r in rels if old[r] != new[r] and not r.endswith(COMPILED)]
    if outside:
        return f"{', '.join(outside)} is not compiled, so the binary cannot tell"
    try:
        before = code_of(tuple(old.items()), rels[0], tuple(spec.defines), arch)
        after = code_of(tuple(new.items()), rels[0], tuple(spec.defines), arch)
    except (ToolMissing, KernelBuildError, OSError) as exc:
        return f"its code could not be compared ({str(exc).splitlines()[0]})"
    differ = sorted(f for f, d in before.items() if after.get(f) != d)
    if differ:
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        return f"its {arch} code changed ({', '.join(differ[:3])}{more})"
    return None
