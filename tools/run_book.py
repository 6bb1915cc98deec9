#!/usr/bin/env python3
"""Re-execute the book's notebooks with papermill, in _toc.yml order.

Each notebook runs into a temporary file, with its working directory set to book/ (as nbval and
JupyterLab run it). Only a notebook that ran without error is written back over the original,
cleaned of what papermill adds (its injected-parameters cell, its notebook and cell metadata, the
execution timestamps), so that re-running with nothing changed leaves no git diff. A failed
notebook is left untouched; its partial output goes to _build/run_book/ for reading. The exit
status is 1 if any notebook failed.

    python tools/run_book.py                    # every notebook, quick settings
    python tools/run_book.py --full --save-results   # on a GPU: full sweeps, write records
    python tools/run_book.py ch01_scalar -p quick False

Parameters reach only the notebooks that declare them in their `parameters` cell.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
FAILED_DIR = ROOT / "_build" / "run_book"
PAPERMILL_CELL_KEYS = ("papermill", "execution")


def toc_files(toc_path: Path = ROOT / "_toc.yml") -> list[str]:
    """Every file of _toc.yml (root, parts, chapters, sections), in reading order, without suffix."""
    toc = yaml.safe_load(toc_path.read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or ():
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))
            walk(entry.get("chapters"))

    for part in toc.get("parts", ()):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [str(Path(f).with_suffix("")) for f in files]


def book_notebooks(selection: list[str] | None = None) -> list[Path]:
    """The .ipynb pages of the book in _toc order, optionally only those named (stem or path)."""
    notebooks = [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]
    if not selection:
        return notebooks
    wanted = {Path(s).with_suffix("").name for s in selection}
    unknown = wanted - {nb.stem for nb in notebooks}
    if unknown:
        raise SystemExit(f"not a notebook of _toc.yml: {', '.join(sorted(unknown))}; "
                         f"known: {', '.join(nb.stem for nb in notebooks)}")
    return [nb for nb in notebooks if nb.stem in wanted]


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what papermill and nbclient add (the injected-parameters cell, metadata, timestamps),
    so that the committed notebook holds only the sources, the default parameters and the outputs."""
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    nb.metadata.pop("papermill", None)
    for cell in nb.cells:
        for key in PAPERMILL_CELL_KEYS:
            cell.metadata.pop(key, None)
        if cell.metadata.get("tags") == []:
            del cell.metadata["tags"]
    # Number the remaining code cells 1, 2, 3... as a plain run would, without the injected cell.
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.get("execution_count") is not None:
            count += 1
            cell.execution_count = count
            for output in cell.outputs:
                if "execution_count" in output:
                    output.execution_count = count
    return nb


def declared_parameters(path: Path) -> set[str]:
    import papermill

    return set(papermill.inspect_notebook(str(path)))


def run_one(path: Path, parameters: dict, kernel: str | None, timeout: int | None) -> str | None:
    """Execute one notebook; write it back only on success. Returns None, or the failure."""
    import papermill

    params = {k: v for k, v in parameters.items() if k in declared_parameters(path)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        try:
            papermill.execute_notebook(str(path), str(out), parameters=params, kernel_name=kernel,
                                       progress_bar=False, log_output=False, cwd=str(path.parent),
                                       request_save_on_cell_execute=False, execution_timeout=timeout)
        except Exception as exc:  # papermill's own error, a dead kernel, a timeout: all a failure
            saved = None
            if out.exists():
                FAILED_DIR.mkdir(parents=True, exist_ok=True)
                saved = FAILED_DIR / path.name
                shutil.move(out, saved)
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            return f"{type(exc).__name__}: {last}" + (f" (partial output: {saved})" if saved else "")
        nb = clean(nbformat.read(out, as_version=4))
    nbformat.write(nb, path)
    return None


def parse_value(text: str):
    """A -p value as YAML reads it: True, 3, 0.5, [1, 2] or a plain string."""
    return yaml.safe_load(text)


def main(argv=None) -> int:
    from tqdm import tqdm

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="only these (stem or path); default: all")
    p.add_argument("--full", action="store_true", help="quick = False: every seed, the full sweep, more repetitions")
    p.add_argument("--save-results", action="store_true", help="save_results = True: write records under results/")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="any other parameter, as papermill's -p")
    p.add_argument("--kernel", default=None, help="Jupyter kernel name (default: the notebook's, python3)")
    p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: none)")
    args = p.parse_args(argv)

    parameters = {"quick": not args.full, "save_results": args.save_results}
    parameters.update({name: parse_value(value) for name, value in args.parameter})
    notebooks = book_notebooks(args.notebooks)
    failures = {}
    with tqdm(notebooks, unit="notebook", file=sys.stderr) as bar:
        for path in bar:
            bar.set_description(path.stem)
            error = run_one(path, parameters, args.kernel, args.timeout)
            if error:
                failures[path] = error
                bar.write(f"FAILED {path.relative_to(ROOT)}: {error}", file=sys.stderr)
    for path in notebooks:
        status = "FAILED, left unchanged" if path in failures else "executed, written back"
        print(f"{path.relative_to(ROOT)}: {status}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
