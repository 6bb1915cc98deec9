"""The book: committed notebooks are clean and honest, the build passes with warnings as errors,
and the built pages show their figures and rendered math in a real browser (headless chromium).

Without chromium the browser tests fail, saying how to install it, unless ATTNLAB_SKIP_BROWSER=1
(then they skip). ATTNLAB_CHROMIUM names another binary.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from attnlab.book import measured

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import run_book  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--virtual-time-budget=15000")
PAGES_WITH_MATH_AND_FIGURES = ("book/intro", "book/ch01_scalar")


def notebooks() -> list[Path]:
    return run_book.book_notebooks()


# --- the committed notebooks ------------------------------------------------------------------

def chapter_pages() -> dict[int, Path]:
    """Chapter number -> its notebook (book/chNN_*.ipynb)."""
    return {int(p.stem[2:4]): p for p in notebooks() if re.fullmatch(r"ch\d\d_\w+", p.stem)}


def test_toc_lists_every_notebook_in_reading_order():
    files = run_book.toc_files()
    assert files[:6] == ["book/intro", "book/running", "book/environment", "book/cpu_executor", "book/model",
                         "book/ch01_scalar"]
    on_disk = {f"book/{p.stem}" for p in (ROOT / "book").glob("*.ipynb")}
    assert on_disk <= set(files), f"notebooks outside _toc.yml: {sorted(on_disk - set(files))}"
    numbers = list(chapter_pages())
    assert numbers == sorted(numbers) and numbers[0] == 1


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.stem)
def test_notebook_is_committed_executed_and_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert "papermill" not in nb.metadata
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "execute it in order, once"
    for cell in code:
        tags = cell.metadata.get("tags", [])
        assert "injected-parameters" not in tags
        assert not {"papermill", "execution"} & set(cell.metadata), f"{cell.id}: run metadata left in"
        for out in cell.outputs:
            assert out.output_type != "error", f"{cell.id} holds an error"
            assert not (out.output_type == "stream" and out.name == "stderr"), f"{cell.id} wrote to stderr"
            assert "image/svg+xml" not in out.get("data", {}), f"{cell.id}: figures are PNG (SVG changes every run)"


def test_chapter_notebooks_take_the_batch_parameters():
    for path in notebooks():
        if path.stem.startswith("ch"):
            assert {"quick", "save_results"} <= run_book.declared_parameters(path), path.name


def _ignored_output_text(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    texts = []
    for cell in nb.cells:
        if cell.cell_type == "code" and "nbval-ignore-output" in cell.metadata.get("tags", []):
            for out in cell.outputs:
                texts.append(out.get("text", ""))
                texts += [v for k, v in out.get("data", {}).items() if "text" in k and isinstance(v, str)]
    return "\n".join(texts)


def test_no_time_is_shown_without_a_fresh_record():
    """While no kernel of a chapter has a fresh bench record, its committed page must say so, once,
    and show no time: numbers come from records, never from a notebook alone."""
    from attnlab.book.page import fresh_records
    from attnlab.kernels.registry import KERNELS

    # Chapters that measure other chapters' kernels: 8 searches the kernels of 5-7, 9 scores them all.
    measures = {8: (5, 6, 7), 9: tuple(range(1, 8))}
    for chapter, page in chapter_pages().items():
        kernels = [k for k, spec in KERNELS.items() if spec.chapter in measures.get(chapter, (chapter,))]
        assert kernels, f"{page.name}: no kernel of chapter {chapter} in the registry"
        if any(fresh_records("bench", k) for k in kernels):
            continue
        text = _ignored_output_text(page)
        assert "Measured now" not in text, \
            f"{page.name} shows a GPU run, but results/ holds no fresh bench record of {kernels}"
        assert text.count("No time on this page is measured yet") == 1, \
            f"{page.name}: a page without records says so once, at its top"
        assert "awaits a GPU" not in text, f"{page.name} repeats the notice in its cells"
        for line in text.splitlines():  # a time without a record is a prediction, and says so
            assert not re.search(r"\d\s*(µs|us|ms)\b", line) or "predicted" in line.lower(), \
                f"{page.name} shows a time without a record, not labelled predicted: {line!r}"


def test_clean_strips_what_papermill_adds():
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("quick = True", metadata={"tags": ["parameters"]}, execution_count=1)
    injected = nbformat.v4.new_code_cell("quick = False", execution_count=2,
                                         metadata={"tags": ["injected-parameters"], "papermill": {}})
    body = nbformat.v4.new_code_cell("1 + 1", execution_count=3,
                                     metadata={"papermill": {"duration": 1.0}, "execution": {"x": "t"}, "tags": []},
                                     outputs=[nbformat.v4.new_output("execute_result", {"text/plain": "2"},
                                                                     execution_count=3)])
    nb.cells = [params, injected, body]
    nb.metadata["papermill"] = {"parameters": {"quick": False}}
    out = run_book.clean(nb)
    assert [c.source for c in out.cells] == ["quick = True", "1 + 1"]
    assert "papermill" not in out.metadata
    assert out.cells[1].metadata == {}
    assert out.cells[1].execution_count == 2 and out.cells[1].outputs[0].execution_count == 2


def test_run_one_writes_back_only_success(tmp_path, monkeypatch):
    monkeypatch.setattr(run_book, "FAILED_DIR", tmp_path / "failed")
    good = tmp_path / "good.ipynb"
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("quick = True", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("print('quick' if quick else 'full')")]
    nbformat.write(nb, good)
    assert run_book.run_one(good, {"quick": False, "save_results": True}, None, 120) is None
    out = nbformat.read(good, as_version=4)
    assert [c.source for c in out.cells] == ["quick = True", "print('quick' if quick else 'full')"]
    assert out.cells[1].outputs[0].text == "full\n" and "papermill" not in out.metadata

    bad = tmp_path / "bad.ipynb"
    nb.cells.append(nbformat.v4.new_code_cell("raise ValueError('boom')"))
    nbformat.write(nb, bad)
    before = bad.read_bytes()
    error = run_book.run_one(bad, {}, None, 120)
    assert error and "boom" in error
    assert bad.read_bytes() == before, "a failed notebook is left as it was"
    assert (tmp_path / "failed" / "bad.ipynb").exists()


def test_sanitize_file_masks_units():
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns((ROOT / "book" / "nbval_sanitize.cfg").read_text())
    assert patterns

    def sanitize(s):
        for regex, replace in patterns:
            s = re.sub(regex, replace, s)
        return s

    assert sanitize("took 871.2 µs, 0.62 TFLOP/s, 300 GB/s") == sanitize("took 12.0 µs, 45.1 TFLOP/s, 900 GB/s")
    assert sanitize("178 registers, 32768 B static") == sanitize("96 registers, 16384 B static")
    assert sanitize("8864 instructions: 1837 fp32 math") == sanitize("9000 instructions: 12 fp32 math")
    assert sanitize("grid (4, 8, 1)") != sanitize("grid (4, 9, 1)")


# --- the dual-mode helpers, with records and with a (simulated) GPU ----------------------------

@pytest.fixture
def no_gpu(monkeypatch):
    from attnlab.book import page

    monkeypatch.setattr(page, "has_gpu", lambda: False)
    return page


def _check_record(kernel="01_scalar", older_source=False, created="2026-01-02T00:00:00Z"):
    from synthetic import new_test_record, older

    from attnlab.kernels.registry import get

    rec = new_test_record("check", [get(kernel, "sm_89")], {"seeds": [0]}, created=created)
    rec["cases"] = [{"kernel": kernel, "shape": [1, 8, 512, 64], "causal": c, "seed": 0, "passed": True,
                     "max_err": 1e-4, "fp16_err": 1e-3, "tolerance": 2.1e-3, "sdpa_err": 5e-4, "reason": ""}
                    for c in (False, True)]
    return older(rec) if older_source else rec


def test_without_records_the_steps_say_so(results, no_gpu, capsys):
    page = no_gpu
    cpu_cases = page.check("01_scalar")  # no GPU: the same .cu on the CPU executor, no record to add
    out = capsys.readouterr().out
    assert cpu_cases and all(c.passed and c.kernel == "01_scalar" for c in cpu_cases)
    assert {c.shape for c in cpu_cases} == {tuple(s) for s in page.BOOK_CPU_SHAPES}
    assert "kernels/01_scalar.cu, run on attnlab's CPU executor" in out and "never a timing" in out
    assert "GPU check record" not in out
    assert page.bench(["01_scalar"]) is None
    assert "No fresh measurement of 01_scalar" in measured.measured_sentence(None, "01_scalar")
    assert measured.case_time(None, "01_scalar") is None
    assert measured.recorded_gpus() == []


def test_fresh_records_are_shown_labelled(results, no_gpu, capsys):
    from synthetic import synthetic_record

    from attnlab.records.results import write_record
    from attnlab.shapes import MISSION

    page = no_gpu
    write_record(synthetic_record(shapes=[(1, 8, L, 64) for L in (256, 512, 1024)]), results)
    write_record(_check_record(), results)
    rec = page.bench(["01_scalar"])
    assert rec is not None and rec["gpu"]["name"].startswith("TEST GPU")
    shown = page.check("01_scalar")
    assert shown and all(r.passed for r in shown)
    out = capsys.readouterr().out
    assert "Committed bench record:\n  TEST GPU" in out and "2026-01-01" in out
    assert "run on attnlab's CPU executor" in out  # the CPU run first, then the GPU's record
    assert "Committed GPU check record:\n  TEST GPU" in out and "2/2 cases passed" in out
    sentence = measured.measured_sentence(rec, "01_scalar")
    assert "100.0 µs" in sentence and "flash" in sentence and "floor" in sentence
    assert measured.case_time(rec, "01_scalar", MISSION, True) == 100.0
    assert measured.latest_bench(page.by_key("L4")) is not None
    assert "fresh kernels: 01_scalar" in measured.recorded_gpus()[0]
    fig = measured.roofline(page.by_key("L4"), rec)
    assert len(fig.axes[0].collections) == len(measured.roofline_points(rec))


def test_stale_records_are_not_shown(results, no_gpu, capsys):
    from synthetic import synthetic_record

    from attnlab.records.results import write_record

    page = no_gpu
    write_record(synthetic_record(older_source=True), results)
    write_record(_check_record(older_source=True), results)
    assert page.fresh_records("bench", "01_scalar") == []
    assert page.bench(["01_scalar"]) is None
    assert page.check("01_scalar") and "GPU check record" not in capsys.readouterr().out
    assert "is not fresh: its source changed: kernels/01_scalar.cu" in page._stale_note("bench", "01_scalar")
    assert "fresh kernels: none" in measured.recorded_gpus()[0]


def test_only_fresh_kernels_of_a_record_are_shown(results, scratch_repository):
    from synthetic import git, synthetic_record

    from attnlab.book import page
    from attnlab.records.results import write_record

    path = write_record(synthetic_record(also=["02_block_tiling"]))
    source = scratch_repository / "kernels" / "02_block_tiling.cu"
    source.write_text(source.read_text().replace("KEY_CHUNK = 8;", "KEY_CHUNK = 4;"))  # other code, not a comment
    git(scratch_repository, "commit", "-q", "-am", "change 02", date="2020-01-03T00:00:00Z")
    [kept] = page.fresh_records("bench", "01_scalar")
    assert set(kept["kernels"]) == {"01_scalar"}
    assert all(set(c["kernels"]) == {"01_scalar"} for c in kept["cases"])
    assert page.fresh_records("bench", "02_block_tiling") == []
    assert "02_block_tiling" in json.loads(path.read_text())["kernels"], "the record itself is left alone"


def test_gpu_path_measures_asserts_and_saves(results, monkeypatch, capsys):
    """The GPU branch, with the measurement itself replaced: what it prints, saves and asserts."""
    from synthetic import synthetic_record

    import attnlab.gpu.bench
    import attnlab.gpu.check
    import attnlab.records.results
    from attnlab.book import page
    from attnlab.gpu.check import CaseResult

    monkeypatch.setattr(page, "has_gpu", lambda: True)
    monkeypatch.setattr(page, "device_name", lambda: "TEST GPU (NVIDIA L4 table entry)")
    made = _check_record()  # made before new_record is replaced, as the bench records below
    timed = synthetic_record(shapes=[tuple(s) for s in page.bench_shapes(True)])
    wrong = synthetic_record()
    monkeypatch.setattr(attnlab.records.results, "new_record", lambda kind, specs, settings=None: {
        **made, "cases": [], "settings": settings or {}})
    passed = [CaseResult("01_scalar", (1, 8, 512, 64), False, 0, True, 1e-4, 1e-3, 2.1e-3, 5e-4)]
    monkeypatch.setattr(attnlab.gpu.check, "run_suite", lambda specs, seeds, progress: passed)
    monkeypatch.setattr(attnlab.gpu.bench, "run_bench", lambda specs, shapes, quick, progress: timed)

    assert page.check("01_scalar", save=True) == passed
    rec = page.bench(["01_scalar"], quick=True, save=True)
    assert rec["cases"] and len(list(results.rglob("*.json"))) == 2
    out = capsys.readouterr().out
    assert "Checked now on TEST GPU" in out and "Measured now:\n  TEST GPU" in out

    failed = [CaseResult("01_scalar", (1, 2, 17, 64), True, 0, False, 1.0, 1e-3, 2.1e-3, 5e-4, "max error")]
    monkeypatch.setattr(attnlab.gpu.check, "run_suite", lambda specs, seeds, progress: failed)
    with pytest.raises(AssertionError, match="1 cases failed"):
        page.check("01_scalar")
    wrong["cases"][0]["kernels"]["01_scalar"]["check"]["passed"] = False
    monkeypatch.setattr(attnlab.gpu.bench, "run_bench", lambda specs, shapes, quick, progress: wrong)
    with pytest.raises(AssertionError, match="no result"):
        page.bench(["01_scalar"])


def test_chapter_renders_figures_from_a_record(results, tmp_path):
    """ch01 executed against a results/ holding a record (the GPU hidden from the kernel): the
    measuring cells draw the record's figures and the prose gets its numbers."""
    import papermill
    from synthetic import synthetic_record

    from attnlab.records.results import write_record
    from attnlab.shapes import QUICK_SWEEP_LENGTHS

    write_record(synthetic_record(shapes=[(1, 8, L, 64) for L in QUICK_SWEEP_LENGTHS]), results)
    out = tmp_path / "ch01.ipynb"
    env = {"ATTNLAB_RESULTS": str(results), "CUDA_VISIBLE_DEVICES": ""}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        papermill.execute_notebook(str(ROOT / "book" / "ch01_scalar.ipynb"), str(out), cwd=str(ROOT / "book"),
                                   progress_bar=False, kernel_name="python3")
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    nb = nbformat.read(out, as_version=4)
    bench_cell = next(c for c in nb.cells if c.cell_type == "code" and "page.bench(" in c.source)
    pngs = [o for o in bench_cell.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 4, "bars and sweep, causal and not"
    assert "Committed bench record:\n  TEST GPU" in "".join(o.get("text", "") for o in bench_cell.outputs)
    glued = [v for c in nb.cells if c.cell_type == "code" for o in c.outputs
             for k, v in o.get("data", {}).items() if k.startswith("application/papermill.record/")]
    assert any("01_scalar took 100.0 µs" in v for v in glued), glued
    assert any("Measured: causal took 1.00 times" in v for v in glued), glued


# --- the build --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The book built from the working tree into a temporary folder, offline, warnings as errors."""
    jb = shutil.which("jupyter-book") or str(Path(sys.executable).with_name("jupyter-book"))
    out = tmp_path_factory.mktemp("book")
    proc = subprocess.run([jb, "build", str(ROOT), "--path-output", str(out), "-W", "-n", "--keep-going"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"jupyter-book build failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    html = out / "_build" / "html"
    assert (html / "index.html").exists()
    return html


def test_build_has_every_page_and_offline_mathjax(built):
    for page in run_book.toc_files():
        assert (built / f"{page}.html").exists(), page
    assert (built / "_static" / "mathjax" / "tex-mml-chtml.js").stat().st_size > 500_000
    assert list((built / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    for page in PAGES_WITH_MATH_AND_FIGURES:
        text = (built / f"{page}.html").read_text()
        scripts = re.findall(r'<script[^>]+src="([^"]+)"', text)
        assert any("_static/mathjax/tex-mml-chtml.js" in s for s in scripts), scripts
        assert not [s for s in scripts if s.startswith(("http:", "https:", "//"))], "a script from the network"


# --- the browser ------------------------------------------------------------------------------

def chromium() -> str | None:
    for cand in (os.environ.get("ATTNLAB_CHROMIUM"), "chromium", "chromium-browser", "google-chrome",
                 "/usr/bin/chromium"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def require_browser() -> str:
    """The chromium binary; without one the calling test fails, or skips if ATTNLAB_SKIP_BROWSER=1."""
    found = chromium()
    if found:
        return found
    if os.environ.get("ATTNLAB_SKIP_BROWSER") == "1":
        pytest.skip("no chromium, and ATTNLAB_SKIP_BROWSER=1")
    pytest.fail("chromium not found: install it (Debian: apt-get install -y chromium) or set "
                "ATTNLAB_CHROMIUM to a Chrome/Chromium binary; ATTNLAB_SKIP_BROWSER=1 skips the browser tests")


class _Page(HTMLParser):
    """The img sources, the MathJax containers, and the visible text of a dumped DOM."""

    def __init__(self):
        super().__init__()
        self.images: list[str] = []
        self.mathjax = 0
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))
        elif tag == "mjx-container":
            self.mathjax += 1
        if tag in ("script", "style", "mjx-assistive-mml", "math"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style", "mjx-assistive-mml", "math") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def _run_chromium(binary: str, args: list[str], tmp_path: Path, window: str = "1280,2400") -> subprocess.CompletedProcess:
    cmd = [binary, *CHROMIUM_FLAGS, f"--window-size={window}", f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


# Chapter 7's overview and step pages at the reader's width: no page taller, no table a reader sees
# without opening a dropdown longer (its rows, the header not counted).
CH07_MAX_HEIGHT_PX = 12_000
CH07_MAX_TABLE_ROWS = 12
READER_WINDOW = (1200, 900)  # a laptop's browser window: the width every page must fit, its first screen


def probe_page(browser: str, html: Path, tmp_path: Path) -> dict:
    """What a reader sees of a built page at READER_WINDOW, measured in chromium by
    tests/browser_probe.js (run in a copy beside the page, so its figures and styles resolve)."""
    probe = (Path(__file__).with_name("browser_probe.js")).read_text()
    copy = html.with_name(f"_probe_{html.name}")
    copy.write_text(html.read_text().replace("</body>", f"<script>{probe}</script></body>", 1))
    try:
        proc = _run_chromium(browser, ["--dump-dom", copy.as_uri()], tmp_path, "{},{}".format(*READER_WINDOW))
    finally:
        copy.unlink()
    assert proc.returncode == 0, f"chromium failed on {html.name}: {proc.stderr[-3000:]}"
    found = re.findall(r'<pre id="attnlab-probe"[^>]*>(.*?)</pre>', proc.stdout, re.S)
    assert found, f"{html.name}: the probe did not run"
    return json.loads(unescape(found[-1]))


def test_probe_sees_what_the_page_test_looks_for(tmp_path):
    """The probe itself: a line that runs past its block, a table cell that breaks inside a word,
    a table wider than its column, a figure that does not load and a question below the first
    screen are all seen; words a cell wraps between, or after a hyphen, are not broken."""
    browser = require_browser()
    page = tmp_path / "page.html"
    squeezed = 'style="overflow-wrap: anywhere; width: 3em"'
    page.write_text('<html><body><article class="bd-article">'
                    '<pre style="white-space: pre; overflow-x: auto; width: 300px">' + "x" * 400 + "</pre>"
                    f'<table style="width: 4em"><tr><th {squeezed}>short name</th><td {squeezed}>LDGSTS</td>'
                    f'<td style="width: 3em">a b c d-e</td><td style="width: 2.5em">p10-p90</td></tr></table>'
                    '<div style="overflow-x: auto; width: 200px"><table><tr>'
                    '<td style="white-space: nowrap">' + "wide " * 80 + "</td></tr></table></div>"
                    '<img src="missing.png"><div style="height: 1500px"></div>'
                    '<details><summary>closed</summary><table><tr><td>a</td></tr><tr><td>b</td></tr></table></details>'
                    '<div class="admonition question">Question. Prediction.</div></article></body></html>')
    seen = probe_page(browser, page, tmp_path)
    assert len(seen["clipped"]) == 1 and seen["clipped"][0].startswith("pre")
    assert len(seen["wide_tables"]) == 1 and seen["wide_tables"][0].startswith("div"), seen["wide_tables"]
    broken = {b["cell"]: b["words"] for b in seen["broken_words"]}
    assert set(broken) == {"short name", "LDGSTS"}, broken
    assert broken["LDGSTS"] == ["LDGSTS"] and "short" in broken["short name"]
    assert seen["images"] == [{"src": "missing.png", "loaded": False}]
    assert seen["question"]["top"] > READER_WINDOW[1]
    assert seen["height"] > 1500
    assert [t["rows"] for t in seen["tables"]] == [1, 1], "the table in the closed dropdown is not seen"


def test_pages_read_at_reader_width(built, tmp_path):
    """Every page of the book at 1,200 px: no code or output clipped or scrolling sideways, no
    table cell broken inside a word (a table wider than the column scrolls inside its wrapper
    instead, never the page), every figure loaded, no word of a brief; each chapter's first screen
    holds its question and its prediction; chapter 7's pages stay under CH07_MAX_HEIGHT_PX, with
    no table in sight over CH07_MAX_TABLE_ROWS rows."""
    browser = require_browser()
    problems = []
    for page in run_book.toc_files():
        name = Path(page).name
        seen = probe_page(browser, built / f"{page}.html", tmp_path)
        if seen["page_wider_than_window"]:
            problems.append(f"{name}: the page is wider than the window")
        problems += [f"{name}: clipped {c}" for c in seen["clipped"]]
        problems += [f"{name}: a cell of the table headed {b['table']!r} breaks inside "
                     f"{', '.join(map(repr, b['words']))}: {b['cell']!r}" for b in seen["broken_words"]]
        problems += [f"{name}: figure {i['src']} did not load" for i in seen["images"] if not i["loaded"]]
        if re.search(r"\bbriefs?\b", seen["text"], re.I):
            problems.append(f"{name}: speaks of a brief")
        if name.startswith("ch07"):  # chapter 7 in steps: each page read in one sitting
            if seen["height"] > CH07_MAX_HEIGHT_PX:
                problems.append(f"{name}: {seen['height']} px tall, over {CH07_MAX_HEIGHT_PX}")
            problems += [f"{name}: a table of {t['rows']} rows (headed {t['head']!r}), over {CH07_MAX_TABLE_ROWS}"
                         for t in seen["tables"] if t["rows"] > CH07_MAX_TABLE_ROWS]
        if re.fullmatch(r"ch\d\d_\w+", name):
            q = seen["question"]
            if q is None or "Question" not in q["text"] or "Prediction" not in q["text"]:
                problems.append(f"{name}: no question-and-prediction admonition")
            elif q["top"] > READER_WINDOW[1]:
                problems.append(f"{name}: its question starts {q['top']:.0f} px down, below the first screen")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES_WITH_MATH_AND_FIGURES)
def test_page_in_browser_has_figures_and_rendered_math(built, page, tmp_path):
    browser = require_browser()
    html = built / f"{page}.html"
    proc = _run_chromium(browser, ["--dump-dom", html.as_uri()], tmp_path)
    assert proc.returncode == 0 and "<html" in proc.stdout, f"chromium failed: {proc.stderr[-3000:]}"
    dom = _Page()
    dom.feed(proc.stdout)

    pngs = [src for src in dom.images if src.split("?")[0].endswith(".png")]
    assert pngs, f"{page}: no figure in the page"
    for src in pngs:
        path = (html.parent / src.split("?")[0]).resolve()
        assert path.is_file(), f"{page}: figure {src} is missing"
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, f"{page}: {src} is not a real PNG"

    assert dom.mathjax > 0, f"{page}: MathJax rendered nothing (no mjx-container in the DOM)"
    text = "".join(dom.text)
    for raw in ("$$", r"\frac", r"\begin", r"\[", r"\(", r"\operatorname"):
        assert raw not in text, f"{page}: raw TeX {raw!r} left in the rendered page"

    shot = tmp_path / f"{Path(page).name}.png"
    proc = _run_chromium(browser, [f"--screenshot={shot}", html.as_uri()], tmp_path)
    assert proc.returncode == 0 and shot.read_bytes()[:8] == PNG_MAGIC, f"no screenshot: {proc.stderr[-2000:]}"
    assert shot.stat().st_size > 50_000, "the screenshot is nearly empty"


def test_committed_figures_are_png_and_match_the_build(built):
    """Each PNG output of the notebooks appears among the built images (none lost on the way)."""
    import base64
    import hashlib

    built_images = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (built / "_images").glob("*.png")}
    for path in notebooks():
        for cell in nbformat.read(path, as_version=4).cells:
            for out in cell.get("outputs", []):
                png = out.get("data", {}).get("image/png")
                if png:
                    digest = hashlib.sha256(base64.b64decode(png)).hexdigest()
                    assert digest in built_images, f"{path.name} {cell.id}: figure missing from the build"


def test_json_of_notebooks_is_stable():
    """nbformat's own layout (indent 1, sorted keys): re-executing rewrites the same bytes."""
    for path in notebooks():
        nb = nbformat.read(path, as_version=4)
        assert path.read_text() == nbformat.writes(nb) + "\n", f"{path.name} is not in nbformat's layout"
        json.loads(path.read_text())
