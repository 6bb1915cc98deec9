"""Which commit a record measured, and whether this repository can vouch for it.

A record names the commit its tree was at and a digest of that tree (kernels/ and src/, paths and
contents). A record is *bound* to this repository when
- its commit is in the history of HEAD,
- the tree at that commit hashes to the digest the record claims (so the record's kernel and
  harness hashes can be recomputed from the commit's own files, and are: attnlab.records.results),
- it was made after that commit and not in the future.
A run from a tree with uncommitted changes names no commit its numbers belong to: it is kept for
local reading and never shown in the book. Commits order records ("freshest" is the record of the
latest commit, the clock only breaks ties within one commit).

A copy of the tree whose git lacks the commit it is at (a GPU machine's: no .git, or the
repository as last landed, without the commits made since) knows one commit: the one
scripts/gpu_prepare.sh stamped into ATTNLAB_GIT_COMMIT, _TREE and _TIME, and only while the copy
still hashes to _TREE.

The digest, not the commit's name, is what ties a record to code: a record whose commit this
history lacks (a rewritten history), or that names an older commit and calls itself dirty (a GPU
copy whose .git stood at the last landed commit), is bound to the latest commit before it whose
kernels/ and src/ hash to its digest, when there is one. It measured exactly that commit's code.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..paths import repo_root

# The folders whose files decide a number (the kernels, the harness); everything else (the book,
# results/, tests) may change without touching what a record measured.
TREE_FOLDERS = ("kernels", "src")
# Clocks of two machines (the GPU's, the one that committed) disagree a little.
CLOCK_SKEW_S = 600


def _counted(rel: str) -> bool:
    return "__pycache__" not in rel and ".egg-info" not in rel


def digest_files(files: dict[str, bytes]) -> str:
    """sha256 over (relative path, contents) pairs in path order: the tree digest."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel] + b"\0")
    return h.hexdigest()


def working_files(root: Path | None = None) -> dict[str, bytes]:
    """kernels/ and src/ of the working tree, as digest_files takes them: the files git tracks or
    would track (ignored ones, such as a stray cubin, are left out, as a commit leaves them out);
    every file where there is no git (a GPU machine's copy holds no ignored file)."""
    root = root or repo_root()
    if _own_history(root):
        listed = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *TREE_FOLDERS)
        rels = sorted(r for r in listed.stdout.decode().split("\0") if r)
        return {rel: (root / rel).read_bytes() for rel in rels if _counted(rel) and (root / rel).is_file()}
    out = {}
    for folder in TREE_FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and _counted(rel):
                out[rel] = path.read_bytes()
    return out


def tree_digest(root: Path | None = None) -> str:
    """The digest of the working tree's kernels/ and src/."""
    return digest_files(working_files(root))


@dataclass(frozen=True)
class Commit:
    sha: str
    time: datetime          # committer time, UTC
    order: int              # commits reachable from it: later commits of one line count more
    files: tuple            # ((relative path, contents), ...) of kernels/ and src/ at the commit

    @property
    def tree(self) -> str:
        return digest_files(dict(self.files))

    @functools.cached_property
    def _by_path(self) -> dict[str, bytes]:
        return dict(self.files)

    def read(self, rel: str) -> bytes | None:
        return self._by_path.get(rel)


def _git(root: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, input=input, timeout=60)


def has_git(root: Path | None = None) -> bool:
    try:
        return _git(root or repo_root(), "rev-parse", "--verify", "HEAD").returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _own_history(root: Path) -> bool:
    """True where `root`'s git holds the commit the tree is at. A copy stamped by gpu_prepare.sh
    whose .git lacks the stamped commit (a GPU lease's copy came with the repository as last landed,
    HEAD behind the stamped commit) goes by the stamp, as a copy with no .git does."""
    return _held(("own history", str(root), os.environ.get("ATTNLAB_GIT_COMMIT")), lambda: _asks_own_history(root))


def _asks_own_history(root: Path) -> bool:
    if not has_git(root):
        return False
    stamped = os.environ.get("ATTNLAB_GIT_COMMIT")
    return not stamped or _git(root, "cat-file", "-e", f"{stamped}^{{commit}}").returncode == 0


def head(root: Path | None = None) -> str | None:
    root = root or repo_root()
    if _own_history(root):
        return _held(("head", str(root)), lambda: _git(root, "rev-parse", "HEAD").stdout.decode().strip())
    return os.environ.get("ATTNLAB_GIT_COMMIT") or None


# What git said while the repository is held still (held_still), or None: asked anew each time.
_HELD: dict | None = None


def _held(key: tuple, ask):
    if _HELD is None:
        return ask()
    if key not in _HELD:
        _HELD[key] = ask()
    return _HELD[key]


@contextlib.contextmanager
def held_still():
    """Within the block, HEAD and whether the history holds the tree's commit are asked of git once
    per repository: judging every record asks them of each, hundreds of times, and nothing commits
    in between."""
    global _HELD
    outer, _HELD = _HELD, ({} if _HELD is None else _HELD)
    try:
        yield
    finally:
        _HELD = outer


def find_commit(sha: str, root: Path | None = None) -> tuple[Commit | None, str]:
    """(the commit, "") when `sha` is in HEAD's history, else (None, why not)."""
    root = (root or repo_root()).resolve()
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{40}", sha):
        return None, f"commit {sha!r} is not a full 40-digit commit name"
    if not _own_history(root):
        return _stamped(sha, root)
    return _from_git(sha, str(root), head(root))


def commit_with_tree(tree: str, made: datetime, root: Path | None = None) -> Commit | None:
    """The latest commit in HEAD's history, made before `made` (give or take the clocks' skew),
    whose kernels/ and src/ hash to `tree`; None if there is none (or no history here)."""
    root = (root or repo_root()).resolve()
    if not isinstance(tree, str) or not _own_history(root):
        return None
    top = head(root)
    for sha, when, folders in _history(str(root), top):
        if (when - made).total_seconds() > CLOCK_SKEW_S:
            continue
        key = (str(root), folders)
        if key not in _FOLDER_DIGESTS:  # commits that left kernels/ and src/ alone share one digest
            commit, _ = _from_git(sha, str(root), top)
            _FOLDER_DIGESTS[key] = commit.tree if commit else ""
        if _FOLDER_DIGESTS[key] == tree:
            return _from_git(sha, str(root), top)[0]
    return None


# (repository, object names of a commit's kernels/ and src/) -> the tree digest of those folders
_FOLDER_DIGESTS: dict[tuple[str, tuple], str] = {}


@functools.lru_cache(maxsize=8)
def _history(root_text: str, head_sha: str) -> tuple:
    """(sha, commit time, the object names of its kernels/ and src/) for each commit of HEAD's
    history, newest first: one git call for the list, one for the folders."""
    root = Path(root_text)
    log = _git(root, "log", "--format=%H %ct", head_sha).stdout.decode().split()
    shas, times = log[0::2], log[1::2]
    query = "".join(f"{sha}:{folder}\n" for sha in shas for folder in TREE_FOLDERS).encode()
    answers = _git(root, "cat-file", "--batch-check=%(objectname)", input=query).stdout.decode().splitlines()
    k = len(TREE_FOLDERS)
    return tuple((sha, datetime.fromtimestamp(int(t), timezone.utc), tuple(answers[i * k:(i + 1) * k]))
                 for i, (sha, t) in enumerate(zip(shas, times)))


@functools.lru_cache(maxsize=64)
def _from_git(sha: str, root_text: str, head_sha: str) -> tuple[Commit | None, str]:
    root = Path(root_text)
    if _git(root, "cat-file", "-e", f"{sha}^{{commit}}").returncode != 0:
        return None, f"commit {sha[:12]} does not exist in this repository"
    if _git(root, "merge-base", "--is-ancestor", sha, head_sha).returncode != 0:
        return None, f"commit {sha[:12]} is not in the history of HEAD ({head_sha[:12]})"
    when = int(_git(root, "show", "-s", "--format=%ct", sha).stdout.decode().strip())
    order = int(_git(root, "rev-list", "--count", sha).stdout.decode().strip())
    listing = _git(root, "ls-tree", "-r", "-z", sha, "--", *TREE_FOLDERS).stdout.decode().split("\0")
    blobs = [(line.split("\t", 1)[1], line.split()[2]) for line in listing if line and line.split()[1] == "blob"]
    blobs = [(rel, oid) for rel, oid in blobs if _counted(rel)]
    out = _git(root, "cat-file", "--batch", input="".join(f"{oid}\n" for _, oid in blobs).encode()).stdout
    files, pos = [], 0
    for rel, _ in blobs:  # each answer: "<oid> blob <size>\n<contents>\n"
        eol = out.index(b"\n", pos)
        size = int(out[pos:eol].split()[2])
        files.append((rel, out[eol + 1:eol + 1 + size]))
        pos = eol + 1 + size + 1
    return Commit(sha, datetime.fromtimestamp(when, timezone.utc), order, tuple(files)), ""


def _stamped(sha: str, root: Path) -> tuple[Commit | None, str]:
    stamped, tree, when = (os.environ.get(f"ATTNLAB_GIT_{k}") for k in ("COMMIT", "TREE", "TIME"))
    if not stamped:
        return None, "no git repository here and no stamped commit (scripts/gpu_prepare.sh): no record can be bound"
    if sha != stamped:
        return None, f"commit {sha[:12]} is not the one this copy of the tree was stamped with ({stamped[:12]})"
    files = working_files(root)
    if tree != digest_files(files):
        return None, f"this copy of the tree changed since it was stamped at {stamped[:12]}"
    try:
        time = datetime.fromtimestamp(int(when), timezone.utc)
    except (TypeError, ValueError):
        return None, "the stamp lacks the commit's time (ATTNLAB_GIT_TIME)"
    return Commit(sha, time, 0, tuple(sorted(files.items()))), ""


def describe_now(root: Path | None = None, files: dict[str, bytes] | None = None) -> dict:
    """The `git` block of a new record: the commit HEAD is at, the tree digest, whether the tree
    has changes that commit lacks (`files`: working_files(root), where the caller has them)."""
    root = root or repo_root()
    tree = digest_files(working_files(root) if files is None else files)
    if _own_history(root):
        sha = head(root)
        commit, _ = find_commit(sha, root)
        dirty = commit is None or commit.tree != tree
        return {"commit": sha, "tree": tree, "dirty": dirty}
    sha = os.environ.get("ATTNLAB_GIT_COMMIT") or None
    # A copy whose files no longer hash to the stamp has changes its commit lacks.
    return {"commit": sha, "tree": tree,
            "dirty": sha is None or os.environ.get("ATTNLAB_GIT_DIRTY") == "1"
            or os.environ.get("ATTNLAB_GIT_TREE") != tree}


def parse_utc(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


def binding_problems(git: dict, created_utc: str, root: Path | None = None) -> tuple[Commit | None, list[str]]:
    """(the commit, []) when a record's `git` block and date are bound to this repository; else
    (None or the commit, the reasons). A dirty run is reported as such by the caller."""
    try:
        made = parse_utc(created_utc)
    except ValueError:
        return None, [f"created_utc {created_utc!r} is not UTC ISO-8601"]
    problems = []
    if (made - datetime.now(timezone.utc)).total_seconds() > CLOCK_SKEW_S:
        problems.append(f"made {created_utc}, which is in the future")
    commit, why = find_commit(git.get("commit"), root)
    if commit is None or git.get("tree") != commit.tree:
        commit = commit_with_tree(git.get("tree"), made, root) or commit
    if commit is None:
        return None, problems + [why]
    if git.get("tree") != commit.tree:
        problems.append(f"the tree at commit {commit.sha[:12]} hashes to {commit.tree[:12]}, "
                        f"not to the {str(git.get('tree'))[:12]} the record claims")
    if (commit.time - made).total_seconds() > CLOCK_SKEW_S:
        problems.append(f"made {created_utc}, before its commit {commit.sha[:12]} existed "
                        f"({commit.time:%Y-%m-%dT%H:%M:%SZ})")
    return commit, problems
