"""Chapters 4 and 9 executed against a results/ holding a (synthetic) bench record of the hybrid,
the GPU hidden from the kernel: the cells that only run where a record exists set the measured
ratio against the math backend next to chapter 4's prediction, the same number on both pages."""
import os
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _execute(name: str, results: Path, tmp_path: Path) -> nbformat.NotebookNode:
    import papermill

    out = tmp_path / f"{name}.ipynb"
    env = {"ATTNLAB_RESULTS": str(results), "CUDA_VISIBLE_DEVICES": ""}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        papermill.execute_notebook(str(ROOT / "book" / f"{name}.ipynb"), str(out), cwd=str(ROOT / "book"),
                                   progress_bar=False, kernel_name="python3")
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return nbformat.read(out, as_version=4)


def _glued(nb) -> list[str]:
    return [v for c in nb.cells if c.cell_type == "code" for o in c.outputs
            for k, v in o.get("data", {}).items() if k.startswith("application/papermill.record/")]


@pytest.mark.parametrize("name", ["ch04_cublas_hybrid", "ch09_scoreboard"])
def test_measured_hybrid_sits_next_to_chapter_4s_prediction(name, results, tmp_path):
    from synthetic import synthetic_record

    from attnlab.book import hybrid_model
    from attnlab.records.results import write_record
    from attnlab.shapes import MISSION, QUICK_SWEEP_LENGTHS

    write_record(synthetic_record(kernel="04_cublas_hybrid", also=("03_warp_rows_4w", "03_warp_rows_8w"),
                                  shapes=[(1, 8, L, 64) for L in QUICK_SWEEP_LENGTHS]), results)
    nb = _execute(name, results, tmp_path)
    predicted = f"{hybrid_model.hybrid_over_math(MISSION, *hybrid_model.math_backend_config()):.2f}"
    glued = "\n".join(_glued(nb))
    # the synthetic record times the hybrid at 100 µs and SDPA math at 80 µs at every shape
    assert "1.25 times" in glued and f"predicted {predicted}" in glued, glued[-3000:]
    if name == "ch04_cublas_hybrid":
        tables = [o["data"]["text/markdown"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
                  if "text/markdown" in o.get("data", {}) and "hybrid / math, predicted" in o["data"]["text/markdown"]
                  and "SDPA math |" in o["data"]["text/markdown"]]
        assert tables and f"| 1.25 | {predicted} |" in tables[0], tables
