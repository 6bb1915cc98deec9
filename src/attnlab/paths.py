"""Where attnlab finds its kernels, records and book: relative to the repository, never the cwd."""
from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The repository holding kernels/ and results/ (ATTNLAB_ROOT overrides, for installed copies)."""
    env = os.environ.get("ATTNLAB_ROOT")
    if env:
        return Path(env).resolve()
    return Path(__file__).resolve().parents[2]


def kernels_dir() -> Path:
    return repo_root() / "kernels"


def results_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_RESULTS", repo_root() / "results")).resolve()


def cache_dir() -> Path:
    """Compiled kernels (cubins, static reports); safe to delete."""
    base = os.environ.get("ATTNLAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")), "attnlab")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path
