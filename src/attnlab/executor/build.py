"""Build a kernel's .cu file for the CPU executor: one shared library per source and configuration.

The .cu file is compiled as C++ by the host compiler (g++), against the executor's headers
(include/: <cuda_fp16.h>, <mma.h> and attn_cpu/prelude.h, pre-included) and linked with its
runtime (runtime/*.cpp). The kernel's translation unit is compiled with -fsanitize=thread only for
its instrumentation: every load and store calls __tsan_read<N>/__tsan_write<N>, which the runtime
defines; ThreadSanitizer's own library is never linked.

One rewrite happens on the way, in a copy of the files the kernel includes (line numbers kept,
and #line directives point diagnostics and debug information at the real files): a `__shared__`
declaration becomes a reference into the block's shared memory, which the runtime owns. C++ has
no storage class that is "one per block of fibers", so `extern __shared__ T name[];` becomes
`T* const name = ...dynamic_shared(...)` and `__shared__ T name[R][C], x;` becomes
`type_t<T[R][C]>& name = ...static_shared_as<T[R][C]>(...); type_t<T>& x = ...;`, each slot
named so that findings say `name[3][17]`. Nothing else in the source changes.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from ..paths import cache_dir, kernels_dir

HERE = Path(__file__).resolve().parent
INCLUDE = HERE / "include"
RUNTIME = HERE / "runtime"
CXX_STANDARD = "-std=c++17"
# -O1 keeps every access the source makes visible while still inlining the chapters' helpers;
# -g gives findings their source lines (DWARF 4: binutils 2.40 misplaces files in GCC 12's DWARF 5 line tables
# when a #line directive names another file).
COMMON_FLAGS = (CXX_STANDARD, "-O1", "-gdwarf-4", "-fPIC", "-fno-omit-frame-pointer", "-Wno-unknown-pragmas")
# -fno-tree-sra keeps a 16- or 8-byte vector access (uint4, float2, ...) one access, as the GPU
# issues it: scalar replacement would split `*(uint4*)p = v` into four 4-byte stores whenever v's
# fields are built or used one by one, and the bank and sector counts would see four requests.
# memcpy, memset and memmove stay calls, which the runtime checks (memory.cpp): GCC would expand
# one of a constant size past the instrumentation, unseen (the executor's headers say
# __builtin_memcpy where they move a value's bits). -U_FORTIFY_SOURCE: a compiler that fortifies
# by default (Ubuntu's) would call __memcpy_chk instead.
# -fsanitize-coverage=trace-pc: every basic block first calls __sanitizer_cov_trace_pc, by which
# the runtime counts on how many trips of each loop each block ran (runtime/trips.cpp).
KERNEL_FLAGS = ("-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0", "-fsanitize-coverage=trace-pc",
                "-fno-tree-sra",
                # Findings need line tables and inlined frames, never a variable's location: without
                # var-tracking a chapter-7 compile takes a quarter less time, same machine code.
                "-fno-var-tracking",
                "-fno-builtin-memcpy", "-fno-builtin-memset", "-fno-builtin-memmove", "-U_FORTIFY_SOURCE",
                # A thread's stack is a fiber's 256 KiB (runtime.h): a larger frame fails the build,
                # naming its function, rather than the process at run time.
                "-Werror=frame-larger-than=196608",
                "-include", "attn_cpu/prelude.h")
RUNTIME_FLAGS = ("-O2", "-fvisibility=hidden")

# A `__shared__` declaration, on one line: its qualifiers before the keyword, and everything up to
# the semicolon (the type, `__align__(N)`, and one or more declarators: `x`, `a[N]`, `t[R][C]`).
_SHARED_DECL = re.compile(r"(?P<extern>\bextern[ \t]+)?(?P<quals>(?:\b(?:static|volatile)[ \t]+)*)\b__shared__\b"
                          r"(?P<rest>[^;{}\n]*);")
_ALIGN = re.compile(r"__align__[ \t]*\(([^()]*)\)")
# The first declarator with the type before it (the type is what is left of the shortest match),
# and each further declarator: pointer stars, a name, array extents.
_FIRST = re.compile(r"^(?P<type>.*?\S)(?P<stars>[\s*]*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]*\]\s*)*)$")
_NEXT = re.compile(r"^\s*(?P<stars>[\s*]*?)\s*\b(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]*\]\s*)*)$")


class ExecutorUnavailable(RuntimeError):
    """No C++ compiler (or one without what the executor needs) on this machine."""


class ExecutorBuildError(RuntimeError):
    """The host compiler rejected a kernel; the message carries its log."""


def compiler() -> str:
    """The host C++ compiler ($CXX, else g++), or ExecutorUnavailable saying what to install."""
    name = os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        raise ExecutorUnavailable(f"the CPU executor needs a C++ compiler and {name!r} is not on PATH: "
                                  "install g++ (Debian/Ubuntu: apt-get install g++) or set CXX")
    return path


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def _split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside brackets and parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "[(" 
        depth -= ch in "])"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return parts + [current]


def _shared_declaration(m: re.Match, counter) -> str:
    """The C++ that binds each declarator of one `__shared__` declaration to the runtime's shared
    memory, on one line; the declaration unchanged when it is not one this rewrite knows (the
    leftover `__shared__` then fails the build, naming ATTN_CPU_UNSUPPORTED_SHARED_DECLARATION)."""
    rest = m.group("rest")
    aligns = _ALIGN.findall(rest)
    rest = _ALIGN.sub(" ", rest)
    volatile = "volatile " if "volatile" in m.group("quals") else ""
    pieces = _split_top_level(rest)
    first = _FIRST.match(pieces[0].strip())
    if not first or any(not _NEXT.match(p) for p in pieces[1:]):
        return m.group(0)
    ctype = volatile + " ".join(first.group("type").split())
    align = aligns[0] if aligns else "0"
    out = []
    for i, piece in enumerate(pieces):
        d = first if i == 0 else _NEXT.match(piece)
        stars = d.group("stars").replace(" ", "").replace("\t", "")
        name, dims = d.group("name"), "".join(d.group("dims").split())
        if m.group("extern"):
            if dims != "[]" or stars:
                return m.group(0)
            out.append(f"{ctype}* const {name} = static_cast<{ctype}*>("
                       f"attn_cpu::dynamic_shared({align}, \"{name}\", sizeof({ctype})));")
        else:
            full = f"{ctype}{stars}{dims}"
            out.append(f"attn_cpu::type_t<{full}>& {name} = "
                       f"attn_cpu::static_shared_as<{full}>({next(counter)}, {align}, \"{name}\");")
    return " ".join(out)


def rewrite_shared(text: str, file_id: int) -> str:
    """The source with each __shared__ declaration bound to the runtime's shared memory: `extern
    __shared__ T name[];` becomes a pointer to the launch's dynamic bytes, and every static
    declaration (scalars, arrays of any rank, several names in one statement) a reference to a
    slot of its own. Line numbers are unchanged: every replacement stays on its line."""
    counter = iter(range(file_id * 1000, file_id * 1000 + 1000))
    return _SHARED_DECL.sub(lambda m: _shared_declaration(m, counter), text)


def _tree_digest(paths, contents: dict | None = None) -> str:
    """sha256 over the files' names and bytes (`contents`' bytes where it holds a file)."""
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.name).encode())
        h.update(contents[p] if contents and p in contents else p.read_bytes())
    return h.hexdigest()


# An include at the start of a line, quoted or bracketed (a commented-out one in a block comment
# counts too: the closure then holds one file too many, which costs a rebuild, never a stale library).
_INCLUDE_LINE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?:"([^"\n]+)"|<([^>\n]+)>)', re.M)


def _closure(source: Path, folders) -> dict[Path, bytes]:
    """included_files, with each file's bytes as read once (the key and the build's copy both use them)."""
    seen: dict[Path, bytes] = {}
    todo = [Path(source).resolve()]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen[f] = f.read_bytes()
        for quoted, bracketed in _INCLUDE_LINE.findall(seen[f].decode()):
            where = (f.parent / quoted, *(Path(d) / quoted for d in folders)) if quoted else \
                tuple(Path(d) / bracketed for d in folders)
            found = next((c for c in where if c.is_file()), None)
            if found is not None:
                todo.append(found.resolve())
    return dict(sorted(seen.items()))


def included_files(source: Path, folders) -> list[Path]:
    """`source` and every file it reaches through `#include "..."` (looked up beside the including
    file first, then in `folders`, as the compiler does) or `#include <...>` (in `folders` only).
    Names found in none of them are the executor's own headers (include/, hashed whole) or the
    system's. A kernel's library depends on these files and no other of kernels/: an edit to
    chapter 7 leaves chapter 1's library cached."""
    return list(_closure(source, folders))


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ExecutorBuildError(f"{what} failed ({' '.join(cmd[:3])} ...):\n{proc.stderr[-6000:]}")


def runtime_objects(cxx: str) -> list[Path]:
    """The runtime compiled once per compiler and runtime source (cached)."""
    sources = sorted(RUNTIME.glob("*.cpp"))
    headers = sorted(RUNTIME.glob("*.h")) + sorted(INCLUDE.rglob("*.h"))
    key = hashlib.sha256((_tree_digest(sources + headers) + compiler_version(cxx) + " ".join(COMMON_FLAGS + RUNTIME_FLAGS))
                         .encode()).hexdigest()[:16]
    out_dir = cache_dir() / "cpu" / f"runtime-{key}"
    objects = [out_dir / (s.stem + ".o") for s in sources]
    # A first run's pause, said at a terminal rather than left to look like a hang (never into a
    # notebook's output, which nbval compares).
    if not all(o.exists() for o in objects) and sys.stderr.isatty():
        print("attnlab: building the CPU executor's runtime (once, some seconds)", file=sys.stderr, flush=True)
    for src, obj in zip(sources, objects):
        _compile_once(cxx, src, obj, (*COMMON_FLAGS, *RUNTIME_FLAGS, "-I", str(INCLUDE)),
                      f"compiling the executor runtime ({src.name})")
    return objects


def _compile_once(cxx: str, src: Path, obj: Path, flags, what: str) -> Path:
    """`src` compiled to `obj` unless `obj` is there: under a temporary name, then renamed, so that
    a concurrent build never links half an object (the name is the process's and thread's own:
    cpu.build_libraries builds from several threads)."""
    if not obj.exists():
        obj.parent.mkdir(parents=True, exist_ok=True)
        tmp = obj.with_suffix(f".{os.getpid()}-{threading.get_native_id()}.tmp.o")
        _run([cxx, *flags, "-c", str(src), "-o", str(tmp)], what)
        os.replace(tmp, obj)
    return obj


# Two empty functions linked around the kernel's object (the linker keeps each file's code in the
# order the files are named): the runtime's watchdog (fiber.cpp) takes a thread stuck between them,
# past the time limit, as stuck in the kernel's own code, where it may safely stop it.
_MARKERS = {"begin": 'extern "C" void attn_cpu_kernel_text_begin() {}\n',
            "end": 'extern "C" void attn_cpu_kernel_text_end() {}\n'}


def marker_objects(cxx: str) -> tuple[Path, Path]:
    """The objects linked before and after a kernel's (cached, once per compiler)."""
    key = hashlib.sha256((repr(_MARKERS) + compiler_version(cxx) + " ".join(COMMON_FLAGS)).encode()).hexdigest()[:16]
    out_dir = cache_dir() / "cpu" / f"markers-{key}"
    objects = []
    for name, text in _MARKERS.items():
        src, obj = out_dir / f"kernel_text_{name}.cpp", out_dir / f"kernel_text_{name}.o"
        if not obj.exists():
            _atomic_write(src, text.encode())
        objects.append(_compile_once(cxx, src, obj, COMMON_FLAGS, f"compiling the executor's {name} marker"))
    return objects[0], objects[1]


def _library_sources(source: str, src_dir: Path) -> dict[Path, bytes]:
    """Every file the library's unit reads from src_dir and kernels/, with its bytes."""
    path = src_dir / source
    if path.parent != src_dir or path.suffix not in (".cu", ".cuh") or not path.is_file():
        raise ExecutorBuildError(f"{source} is not a .cu/.cuh file in {src_dir}")
    return _closure(path, (src_dir, kernels_dir().resolve()))


def _key(source: str, entries: tuple, defines: tuple, sources: dict[Path, bytes], cxx: str) -> str:
    objs = runtime_objects(cxx)
    begin, end = marker_objects(cxx)
    key_text = "\n".join([_tree_digest(sources, sources), _tree_digest(sorted(INCLUDE.rglob("*.h"))),
                          source, repr(entries),
                          repr(defines), compiler_version(cxx), " ".join(COMMON_FLAGS + KERNEL_FLAGS),
                          " ".join(str(o) for o in (begin, end, *objs))])
    return hashlib.sha256(key_text.encode()).hexdigest()[:20]


def _normalized(source: str, entries, defines, src_dir) -> tuple:
    """(src_dir resolved, entries, defines sorted): one library, however its caller spelled it."""
    src_dir = Path(src_dir or kernels_dir()).resolve()
    return src_dir, tuple(entries), tuple(sorted((str(n), int(v)) for n, v in defines))


def library_key(source: str, entries, defines=(), src_dir: Path | None = None) -> str:
    """The cache key of build_library's library: the content of the files `source` includes (not
    every file of kernels/), the executor's headers, entries, defines, the compiler, its flags and
    the runtime's objects."""
    src_dir, entries, defines = _normalized(source, entries, defines, src_dir)
    return _key(source, entries, defines, _library_sources(source, src_dir), compiler())


def build_library(source: str, entries, defines=(), src_dir: Path | None = None) -> Path:
    """The shared library that runs `entries` (extern "C" kernels) of `source` (a file under
    `src_dir`, kernels/ by default) on the executor, built with `defines` ((name, value) pairs).
    A `src_dir` other than kernels/ (test kernels) may include kernels/'s headers too.
    Cached under library_key: only the files the source includes (included_files) decide it."""
    cxx = compiler()
    src_dir, entries, defines = _normalized(source, entries, defines, src_dir)
    sources = _library_sources(source, src_dir)
    lib = cache_dir() / "cpu" / "lib" / f"{Path(source).stem}-{_key(source, entries, defines, sources, cxx)}.so"
    if lib.exists():
        return lib
    objs = runtime_objects(cxx)
    begin, end = marker_objects(cxx)
    with tempfile.TemporaryDirectory(prefix="attnlab-cpu-") as tmp:
        work = Path(tmp)
        # Only the included files are there to compile, from the bytes the key was taken of: an
        # include the closure missed fails the build, naming the file, rather than building from a
        # file the key did not see. src_dir's are rewritten (copy/); kernels/'s headers that a
        # kernel elsewhere includes go as they are (headers/).
        copy, headers = work / "kernels", work / "headers"
        copy.mkdir()
        own = [f for f in sources if f.parent == src_dir]
        for i, f in enumerate(own):
            (copy / f.name).write_text(f'#line 1 "{f}"\n' + rewrite_shared(sources[f].decode(), i + 1))
        shared = [f for f in sources if f.parent != src_dir]
        if shared:
            headers.mkdir()
            for f in shared:
                (headers / f.name).write_text(f'#line 1 "{f}"\n' + sources[f].decode())
        wrapper = work / "unit.cpp"
        wrapper.write_text('#include "attn_cpu/thunk.h"\n'
                           f'#include "{copy / source}"\n'
                           + "".join(f"ATTN_CPU_THUNK({e})\n" for e in entries))
        obj = work / "unit.o"
        _run([cxx, *COMMON_FLAGS, *KERNEL_FLAGS, "-I", str(INCLUDE), "-I", str(copy),
              *(["-I", str(headers)] if shared else []),
              *[f"-D{n}={v}" for n, v in defines], "-c", str(wrapper), "-o", str(obj)],
             f"compiling {source} for the CPU executor")
        out = work / "kernel.so"
        _run([cxx, "-shared", "-o", str(out), str(begin), str(obj), str(end), *map(str, objs), "-Wl,-Bsymbolic",
              "-Wl,--wrap=memcpy,--wrap=memmove,--wrap=memset", "-ldl", "-lrt"],
             f"linking {source} for the CPU executor")
        _atomic_write(lib, out.read_bytes())
    return lib


def frames_at(library: Path, offsets) -> dict[int, list[str]] | None:
    """offset -> its frames, "path:line" innermost first (the lines it was inlined at), for each code
    offset in `library`, by addr2line (None without addr2line)."""
    tool = shutil.which("addr2line")
    if tool is None:
        return None
    proc = subprocess.run([tool, "-e", str(library), "-i", "-a"], input="\n".join(hex(o) for o in offsets),
                          capture_output=True, text=True, check=False)
    result: dict[int, list[str]] = {}
    current = None
    for line in proc.stdout.splitlines():
        if line.startswith("0x"):
            current = result.setdefault(int(line, 16), [])
        elif current is not None:
            current.append(line.split(" (discriminator")[0].strip())
    return result


def source_lines(library: Path, offsets) -> dict[int, str]:
    """offset -> "file:line" (inlined frames joined innermost first with " < ") for each code offset
    in `library`, by addr2line; offsets it cannot place map to "?"."""
    offsets = sorted({o for o in offsets if o})
    if not offsets:
        return {}
    result = frames_at(library, offsets)
    if result is None:
        return {o: f"+0x{o:x}" for o in offsets}
    return {o: _frames_text(result.get(o, [])) for o in offsets}


# The executor's own files, as the tail of a path ("executor/include/attn_cpu/prelude.h"): a
# library is cached by content, so one built from another checkout (another CI clone sharing the
# cache) names them under that checkout's path, not under HERE.
_OWN_TAILS = tuple(sorted("/" + "/".join((HERE.name, *p.relative_to(HERE).parts))
                          for p in HERE.rglob("*") if p.suffix in (".h", ".cpp")))


def _frames_text(frames: list[str]) -> str:
    """The frames in kernel sources (the executor's own headers and runtime are plumbing), shortest
    paths."""
    kept = []
    for f in frames:
        path, _, line = f.rpartition(":")
        if not path or path.startswith((str(HERE), "??")) or Path(path).name == "unit.cpp" \
                or path.replace("\\", "/").endswith(_OWN_TAILS):
            continue
        kept.append(f"{Path(path).name}:{line}")
    return " < ".join(dict.fromkeys(kept)) or "?"
