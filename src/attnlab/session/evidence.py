"""Bring a GPU session's archives (attnlab.session.stages) into this checkout.

`python -m attnlab import-evidence ARCHIVE...`:
- reads each archive without trusting it: only regular files under `<stage>/`, no absolute
  paths, no `..`;
- takes each record from `<stage>/results/` into results/ only if it is well formed and every
  kernel it measured hashes, in this checkout, to what was measured: a record of other sources is
  refused, never imported;
- takes each executed notebook from `<stage>/book/` over the page of the same name in book/, only
  if its cells are the page's cells (same kinds, same sources): outputs are all it may change;
- refuses what a rehearsal made (no GPU) unless asked to take it;
- prints each stage's failures from its summary, then runs `verify-results` and nbval on the
  notebooks it brought in.
Exit status 0 only when nothing was refused and both checks passed.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..paths import repo_root, results_dir


@dataclass
class Imported:
    records: list[Path] = field(default_factory=list)
    notebooks: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)


def _members(tar: tarfile.TarFile, archive: Path) -> tuple[list[tarfile.TarInfo], list[str]]:
    ok, refused = [], []
    for m in tar.getmembers():
        parts = PurePosixPath(m.name).parts
        if m.isdir():
            continue
        if not m.isfile() or m.name.startswith("/") or ".." in parts or len(parts) < 2:
            refused.append(f"{archive.name}: {m.name}: not a plain file inside a stage folder")
            continue
        ok.append(m)
    return ok, refused


def record_problems(rec) -> list[str]:
    """Why a record may not enter results/: malformed, not bound to this repository, breaking
    physics, measured from uncommitted changes, or stale for a kernel (attnlab.records.results.assess)."""
    from ..records.results import assess

    item = assess(Path("record"), rec)
    if item.refused:
        return item.refused
    if item.local:
        return ["measured from a tree with uncommitted changes: it could never be shown"]
    return [f"{kid} is stale: " + "; ".join(why) for kid, why in item.stale.items() if why]


def same_cells(new: bytes, page: Path) -> bool:
    """True when an executed notebook holds exactly the page's cells (kinds and sources)."""
    def cells(nb):
        return [(c.get("cell_type"), "".join(c.get("source", ""))) for c in nb.get("cells", [])]
    try:
        return cells(json.loads(new)) == cells(json.loads(page.read_text()))
    except (json.JSONDecodeError, AttributeError):
        return False


def import_archives(archives: list[Path], results: Path | None = None, book: Path | None = None,
                    allow_rehearsal: bool = False) -> Imported:
    results = results or results_dir()
    book = book or repo_root() / "book"
    out = Imported()
    for archive in archives:
        try:
            tar = tarfile.open(archive, "r:gz")
        except (OSError, tarfile.TarError) as exc:
            out.refused.append(f"{archive}: not a readable .tar.gz ({exc})")
            continue
        with tar:
            members, refused = _members(tar, archive)
            out.refused += refused
            summaries = [m for m in members if PurePosixPath(m.name).parts[1:] == ("summary.json",)]
            summary = json.loads(tar.extractfile(summaries[0]).read()) if summaries else None
            if summary is None:
                out.refused.append(f"{archive.name}: no summary.json: not an archive of a GPU session's stage")
                continue
            out.summaries.append(summary)
            rehearsal = summary.get("rehearsal") or summary.get("gpu") in (None, "none")
            if rehearsal and not allow_rehearsal:
                out.refused.append(f"{archive.name}: made by a rehearsal without a GPU; nothing taken")
                continue
            for m in members:
                parts = PurePosixPath(m.name).parts
                where = f"{archive.name}:{m.name}"
                if parts[1] == "results" and m.name.endswith(".json"):
                    _take_record(tar.extractfile(m).read(), Path(*parts[2:]), results, where, out)
                elif parts[1] == "book" and len(parts) == 3 and m.name.endswith(".ipynb"):
                    target = book / parts[2]
                    data = tar.extractfile(m).read()
                    if not target.exists():
                        out.refused.append(f"{where}: book/{parts[2]} is not a page of this book")
                    elif not same_cells(data, target):
                        out.refused.append(f"{where}: its cells differ from book/{parts[2]}'s (the page changed "
                                           "since, or the archive is not what it says): execute it again")
                    else:
                        target.write_bytes(data)
                        out.notebooks.append(target)
    return out


def _take_record(data: bytes, rel: Path, results: Path, where: str, out: Imported) -> None:
    try:
        rec = json.loads(data)
    except json.JSONDecodeError as exc:
        out.refused.append(f"{where}: not JSON ({exc})")
        return
    problems = record_problems(rec)
    if problems:
        out.refused.append(f"{where}: refused: " + "; ".join(problems))
        return
    target = results / rel
    if target.exists() and target.read_bytes() != data:
        out.refused.append(f"{where}: results/{rel} exists with other content")
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    out.records.append(target)


def stage_failures(summary: dict) -> list[str]:
    return [f"{summary['stage']}: {s['status']} {s['step']}" for s in summary.get("steps", ())
            if s["status"] not in ("ok", "no gpu")]


def nbval(notebooks: list[Path]) -> int:
    """nbval over the imported pages, as the README's test command runs it."""
    root = repo_root()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
           "--nbval-sanitize-with", str(root / "book" / "nbval_sanitize.cfg"), *map(str, notebooks)]
    return subprocess.run(cmd, cwd=root).returncode


def main(archives: list[str], run_nbval: bool = True, allow_rehearsal: bool = False) -> int:
    from ..records.results import verify

    imported = import_archives([Path(a) for a in archives], allow_rehearsal=allow_rehearsal)
    for summary in imported.summaries:
        kind = "rehearsal (no GPU)" if summary.get("rehearsal") else f"on {summary.get('gpu')}"
        fails = stage_failures(summary)
        print(f"stage {summary['stage']} {kind}, {summary.get('seconds')} s, {len(summary.get('steps', []))} steps, "
              f"{len(fails)} failed")
        for line in fails:
            print(f"  {line}")
    for path in imported.records:
        print(f"record   {path.relative_to(repo_root()) if path.is_relative_to(repo_root()) else path}")
    for path in imported.notebooks:
        print(f"notebook {path.relative_to(repo_root())}")
    for line in imported.refused:
        print(f"REFUSED  {line}", file=sys.stderr)
    v = verify()
    for p in v.problems:
        print(f"FAIL {p}", file=sys.stderr)
    for p in v.stale:
        print(f"stale {p}")
    print(f"verify-results {'ok' if v.ok else 'FAILED'}: {len(v.fresh)} fresh (GPU, kernel) pairs, {len(v.stale)} stale")
    nb_status = nbval(imported.notebooks) if run_nbval and imported.notebooks else 0
    print(f"imported {len(imported.records)} records and {len(imported.notebooks)} notebooks; "
          f"{len(imported.refused)} refused")
    return 0 if not imported.refused and v.ok and nb_status == 0 else 1
