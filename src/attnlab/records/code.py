"""Whether a kernel whose source changed since a record still compiles to the code the record ran.

A record's kernel is fingerprinted by its source file and headers (fingerprint.source_digests), and
any edit to them changes that digest: a comment, a new entry beside the measured ones, a switch
whose other setting only a new step takes. What decides a measured number is narrower: the cubin
the GPU loaded. So where only compiled files changed, both versions are built here, with one
compiler, the record's target and the build the record ran (its architecture's defines), and the
record's kernel stays fresh exactly when every function of the record's binary is in today's with:
- its SASS, instruction for instruction with the encodings (control codes: stalls, barriers);
- ptxas's resources of it (registers, shared memory, stack, spills);
- its attributes (.nv.info.<function>: parameters, launch bounds, barriers, cluster dims, exit and
  collective offsets) and the module's attributes of it (register count, frame and stack sizes),
  symbol indices replaced by names;
- its shared-memory and parameter sections;
and the module's data (constant banks, initialized globals) is unchanged. A new function beside
them changes nothing the record ran; the launch fingerprint says which entries are launched now.
Anything that cannot be built or read counts as changed.

Each build's digests (or why it failed) are cached on disk by everything that decides them (the
files, configuration, target, flags, the versions of nvcc and cuobjdump, and DIGEST_VERSION), and
per process.
"""
from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import re
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

DIGEST_VERSION = 2    # what a digest covers (above): a change here must not be served from old cache files
COMPILED = (".cu", ".cuh", ".h")  # a change anywhere else (a runner module) is not judged by the binary
TOOL_TIMEOUT_S = 900  # one build of chapter 7's whole source takes about 20 s on one core
MODULE_DATA = (".nv.constant2", ".nv.constant3", ".nv.global.init", ".nv.global")  # data every function may read
_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
_SYMBOL_REF = re.compile(r"function: (\S+?)\(0x[0-9a-f]+\)")  # cuobjdump -elf names a symbol and its index
_PARAM_CBANK = re.compile(r"(Attribute:\tEIATTR_PARAM_CBANK\n\tFormat:\tEIFMT_SVAL\n\tValue:\t)0x[0-9a-f]+")


def source_files(spec) -> list[str]:
    """The repository paths of `spec`'s source and headers, as fingerprint.source_digests names them."""
    return [posixpath.normpath(f"kernels/{name}") for name in (spec.source, *spec.extra_sources)]


_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)


def included_headers(source: bytes) -> list[str]:
    """The repository paths of the headers a kernel source `#include`s by quoted name (beside it,
    under kernels/), in their order: what a commit's version of it compiled with, whether or not
    the spec names them now."""
    return list(dict.fromkeys(posixpath.normpath(f"kernels/{m.decode()}") for m in _INCLUDE.findall(source)))


def files_of(spec, read: Callable[[str], bytes | None]) -> dict[str, bytes | None]:
    """Repository path -> contents as `read` gives them (None: not there) of `spec`'s source and
    headers (source_files), then of any header that source includes and the spec no longer names
    (an `#include` removed since): the files a commit's version of the kernel compiled with."""
    rels = source_files(spec)
    files = {rel: read(rel) for rel in rels}
    for rel in included_headers(files[rels[0]] or b""):
        if rel not in files:
            files[rel] = read(rel)
    return files


def _blocks(text: str, header: re.Pattern, indented: bool = False) -> dict[str, str]:
    """A listing split at the lines `header` matches, by the name it captures; `indented`: a block
    ends at its first line that does not start with a tab (cuobjdump -elf's decoded sections)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if m := header.match(line):
            current = m.group(1)
            out[current] = []
        elif current is not None and indented and not line.startswith("\t"):
            current = None
        elif current is not None:
            out[current].append(line.rstrip())
    return {name: "\n".join(lines) for name, lines in out.items()}


def elf_sections(cubin: bytes) -> dict[str, bytes]:
    """Section name -> contents of an ELF64 little-endian file (a cubin); a NOBITS section (shared
    memory) as its size, written out."""
    if cubin[:5] != b"\x7fELF\x02":
        raise ValueError("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
    names = cubin[headers[names_at][4]:headers[names_at][4] + headers[names_at][5]]
    out = {}
    for name_at, kind, _flags, _addr, offset, size, *_ in headers:
        name = names[name_at:names.index(b"\0", name_at)].decode()
        out[name] = f"NOBITS {size}".encode() if kind == 8 else cubin[offset:offset + size]
    return out


def function_digests(sass: str, ptxas: str, elf: str = "", sections: dict[str, bytes] | None = None) -> dict[str, str]:
    """sha256 of each function of a cuobjdump -sass listing over what decides how it runs (see the
    module's docstring): its SASS lines, ptxas's resources, and from `elf` (cuobjdump -elf) and
    `sections` (elf_sections) its attributes, sections and the module's data."""
    from ..kernels.static import parse_ptxas

    sections = sections or {}
    resources = {f.name: json.dumps(vars(f), sort_keys=True) for f in parse_ptxas(ptxas)}
    elf = _PARAM_CBANK.sub(r"\1<symbol>", _SYMBOL_REF.sub(r"function: \1", elf))
    attributes = _blocks(elf, re.compile(r"^\.nv\.info\.(\S+)$"), indented=True)
    module = _blocks(elf, re.compile(r"^(\.nv\.info)$"), indented=True).get(".nv.info", "")
    entries = re.split(r"(?:^|\n)\t<0x[0-9a-f]+>\n", module)
    data = [name.encode() + b"\0" + sections[name] for name in MODULE_DATA if name in sections]
    out = {}
    for name, lines in _blocks(sass, _FUNCTION).items():
        h = hashlib.sha256()
        for part in (lines, resources.get(name, ""), attributes.get(name, ""),
                     *(e for e in entries if f"function: {name}\t" in e)):
            h.update(part.encode() + b"\0")
        for kind in (".nv.shared.", ".nv.constant0.", ".nv.local."):
            h.update(kind.encode() + sections.get(kind + name, b"") + b"\0")
        for blob in data:
            h.update(blob + b"\0")
        out[name] = h.hexdigest()
    return out


def _key(files: tuple[tuple[str, bytes], ...], main: str, defines: tuple, arch: str) -> str:
    from ..kernels import toolchain
    from ..kernels.compile import NVCC_FLAGS

    h = hashlib.sha256()
    for rel, data in files:
        h.update(rel.encode() + b"\0" + data + b"\0")
    h.update(json.dumps([DIGEST_VERSION, main, [list(d) for d in defines], arch, list(NVCC_FLAGS),
                         toolchain.nvcc_version(), toolchain.cuobjdump_version()]).encode())
    return h.hexdigest()


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TOOL_TIMEOUT_S)


@functools.lru_cache(maxsize=64)
def code_of(files: tuple[tuple[str, bytes], ...], main: str, defines: tuple, arch: str) -> dict:
    """{"functions": function -> digest (function_digests)} of `main` built for `arch` with `defines`
    from `files` ((repository path, contents), ...: the source and its headers, laid out as in the
    repository), or {"error": why} where it cannot be built or read. Both are cached."""
    from ..kernels import toolchain
    from ..kernels.compile import NVCC_FLAGS, define_flags, write_atomic
    from ..paths import cache_dir

    cached = cache_dir() / "code" / f"{_key(files, main, defines, arch)[:32]}.json"
    try:
        return json.loads(cached.read_text())
    except (OSError, ValueError):
        pass
    with tempfile.TemporaryDirectory(prefix="attnlab-code-") as tmp:
        for rel, data in files:
            path = Path(tmp, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        cubin = Path(tmp, "out.cubin")
        built = _run([toolchain.nvcc(), f"-arch={arch}", "-cubin", "-Xptxas", "-v", *NVCC_FLAGS,
                      *define_flags(defines), "-I", str(Path(tmp, "kernels")), "-o", str(cubin), str(Path(tmp, main))])
        if built.returncode != 0:
            result = {"error": f"nvcc failed for {main} ({arch}): {built.stderr.strip()[-300:]}"}
        else:
            sass, elf = (_run([toolchain.cuobjdump(), flag, str(cubin)]) for flag in ("-sass", "-elf"))
            listed = {**function_digests(sass.stdout, built.stderr, elf.stdout, elf_sections(cubin.read_bytes()))}
            result = ({"functions": listed} if sass.returncode == elf.returncode == 0 and listed
                      else {"error": f"cuobjdump listed no function of {main} ({arch})"})
    cached.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cached, json.dumps(result, sort_keys=True))
    return result


def changed_code(spec, arch: str, then: Callable[[str], bytes | None], now: Callable[[str], bytes | None],
                 entries=()) -> str | None:
    """None when `spec` (the build a record of `arch` ran: its defines) built from the files `then`
    gives (a commit's) has `entries` and every other function, each unchanged (see the module's
    docstring), in its build from the files `now` gives; else why not, in words. Never raises:
    whatever cannot be compared counts as changed."""
    try:
        rels = source_files(spec)
        # A header the spec names now may be newer than the record: its old build did without it;
        # one the spec no longer names may be older: the old source still includes it (files_of).
        old = {r: data for r, data in files_of(spec, then).items() if data is not None}
        new = {r: now(r) for r in rels}
        if rels[0] not in old or any(data is None for data in new.values()):
            return "a source file is missing at one of the two commits"
        outside = [r for r in rels if old.get(r) != new[r] and not r.endswith(COMPILED)]
        if outside:
            return f"{', '.join(outside)} is not compiled, so the binary cannot tell"
        defines = tuple(tuple(d) for d in spec.defines)
        before, after = (code_of(tuple(files.items()), rels[0], defines, arch) for files in (old, new))
        for built in (before, after):
            if "error" in built:
                return f"its code could not be compared ({built['error'].splitlines()[0]})"
        before, after = before["functions"], after["functions"]
        missing = sorted(set(entries) - set(before))
        if missing:
            return f"its code could not be compared ({', '.join(missing)} not in the build of then)"
        differ = sorted(f for f, d in before.items() if after.get(f) != d)
    except Exception as exc:  # noqa: BLE001 - a comparison that fails leaves the record stale, never refused
        return f"its code could not be compared ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})"
    if differ:
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        return f"its {arch} code changed ({', '.join(differ[:3])}{more})"
    return None
