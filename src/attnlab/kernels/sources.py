"""A kernel's source text and its fingerprint: the sha256 that records are checked against."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from ..paths import kernels_dir
from .registry import KernelSpec


def source_files(spec: KernelSpec) -> list[Path]:
    """The .cu file and the headers it includes, in a fixed order."""
    return [spec.path] + [kernels_dir() / name for name in spec.extra_sources]


def kernel_hash(spec: KernelSpec) -> str:
    """sha256 over the kernel and its headers: any edit that can change the binary changes it.

    Cached on the files' (mtime, size), so a launch pays a stat, not a hash; an edit made in a
    notebook session still changes the hash and so triggers a rebuild."""
    files = source_files(spec)
    return _hash_files(tuple(files), tuple((p.stat().st_mtime_ns, p.stat().st_size) for p in files))


@functools.lru_cache(maxsize=256)
def _hash_files(files: tuple[Path, ...], stamps: tuple) -> str:
    return digest_named((path.name, path.read_bytes()) for path in files)


def digest_named(named) -> str:
    """sha256 over (file name, contents) pairs in order: the one formula of a kernel's hash, for
    the working tree's files (kernel_hash) and a commit's (fingerprint.source_digests)."""
    h = hashlib.sha256()
    for name, data in named:
        h.update(name.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def read_source(spec: KernelSpec) -> str:
    return spec.path.read_text()
