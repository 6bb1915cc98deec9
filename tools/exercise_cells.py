#!/usr/bin/env python3
"""Write each chapter's closing "Exercises" cell from the exercise registry
(attnlab.exercises.registry), so that a page lists exactly the exercises that exist, with their
titles: a markdown cell (nothing to execute), its block collapsed, the last cell of the chapter's
page. tests/test_exercises.py fails when a page and the registry disagree.

    python tools/exercise_cells.py          # rewrite the cells
    python tools/exercise_cells.py --check  # exit 1 if a page is not what this would write
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnlab.exercises.registry import REGISTRY  # noqa: E402

# The page that ends each chapter's exercises (chapter 7's overview, not its steps).
PAGES = {1: "ch01_scalar", 2: "ch02_block_tiling", 3: "ch03_warp_reductions", 4: "ch04_cublas_hybrid",
         5: "ch05_wmma", 6: "ch06_warp_specialization", 7: "ch07_mma_swizzle"}
MARKER = "<!-- exercises: written by tools/exercise_cells.py from the exercise registry -->"


def _md(text: str) -> str:
    """A title as table text: underscores and pipes escaped, code spans kept."""
    parts = text.split("`")
    return "`".join(p if i % 2 else p.replace("_", "\\_").replace("|", "\\|") for i, p in enumerate(parts))


def cell_text(chapter: int) -> str:
    mine = [e for e in REGISTRY if e.chapter == chapter]
    first = mine[0].id
    # links relative to book/: JupyterLab opens the file in its editor, the built book offers it
    rows = "\n".join(f"| [`{e.id}`](../exercises/{e.id}.cu) | {_md(e.title)} |" for e in mine)
    return f"""{MARKER}
## Exercises

::::{{dropdown}} {len(mine)} exercises on this chapter's kernel, solved on a laptop
Each is a short CUDA C++ file, one piece of this chapter's kernel with one marked gap
(`// ---- TODO(exercise)`). Fill the gap and let the CPU executor judge it: it runs your kernel at
several shapes, checks it as it checks the book's kernels (the pass rule against the reference,
races, bounds, barriers, bank conflicts) and answers in one line what is wrong, and where, with a
hint. No GPU needed.

| exercise | you write |
|---|---|
{rows}

From this notebook, in a new code cell:

```python
import attnlab.exercises as ex
ex.start("{first}")  # copies the skeleton to my-exercises/, with a link to open it
```

Fill the gap in that copy, save it, and check it (as often as you like):

```python
ex.check("{first}")  # one line: passes, or what is wrong and where, with a hint
```

In a terminal, from the repository root:
`python -m attnlab exercises check {first} my-exercises/{first}.cu`.
`python -m attnlab exercises` lists every exercise; the solutions are in `exercises/solutions/`,
and `exercises/README.md` says more.
::::
"""


def page_path(chapter: int) -> Path:
    return ROOT / "book" / f"{PAGES[chapter]}.ipynb"


def written(chapter: int) -> str | None:
    """The page's exercise cell as it stands (None: it has none)."""
    nb = json.loads(page_path(chapter).read_text())
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and text.startswith(MARKER):
            return text
    return None


def write(chapter: int) -> bool:
    """Put the cell at the end of the page (replacing the old one); True if the page changed."""
    path = page_path(chapter)
    nb = json.loads(path.read_text())
    text = cell_text(chapter)
    cells = [c for c in nb["cells"] if not (c["cell_type"] == "markdown" and "".join(c["source"]).startswith(MARKER))]
    lines = text.splitlines(keepends=True)
    cells.append({"cell_type": "markdown", "id": f"exercises-ch{chapter:02d}", "metadata": {}, "source": lines})
    if cells == nb["cells"]:
        return False
    nb["cells"] = cells
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="report pages that differ; change nothing")
    args = p.parse_args()
    stale = [PAGES[c] for c in PAGES if written(c) != cell_text(c)]
    if args.check:
        for name in stale:
            print(f"book/{name}.ipynb: its exercise cell is not the registry's (python tools/exercise_cells.py)")
        return 1 if stale else 0
    for c in PAGES:
        if write(c):
            print(f"book/{PAGES[c]}.ipynb: exercise cell written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
