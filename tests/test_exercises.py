"""The exercises (exercises/, attnlab.exercises): every solution passes its checker; every untouched
skeleton compiles and fails with a message that names what is wrong; a few typical mistakes get
the message that teaches them; the registry covers every chapter; `python -m attnlab exercises`
lists and checks. Builds are cached on disk by content, so a second run mostly launches."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from attnlab.executor.build import compiler
from attnlab.exercises.registry import EXERCISES, REGISTRY, check, exercises_dir

try:
    compiler()
    HAVE_CXX = True
except Exception:  # noqa: BLE001  (ExecutorUnavailable: no g++)
    HAVE_CXX = False
needs_cxx = pytest.mark.skipif(not HAVE_CXX, reason="the CPU executor needs g++")

IDS = list(EXERCISES)

# What an untouched skeleton's verdict must say: the kind of trouble its placeholder causes.
SKELETON_SAYS = {
    "ch01-online-softmax": ("wrong at",),
    "ch01-causal-limit": ("wrong at", "causal"),
    "ch02-tile-barriers": ("race", "ch02-tile-barriers.cu:"),
    "ch02-pad-q-tile": ("bank conflicts", "shared store", "ch02-pad-q-tile.cu:"),
    "ch03-warp-reduce": ("wrong sum", "nothing was reduced"),
    "ch03-row-groups": ("NaN",),
    "ch04-row-tail": ("NaN",),
    "ch04-merge-lanes": ("wrong at",),
    "ch05-score-tile": ("uninitialized shared read", "ch05-score-tile.cu:"),
    "ch05-pv": ("wrong at",),
    "ch06-ring-barriers": (("race", "cp.async read before wait"), "ch06-ring-barriers.cu:"),
    "ch06-cp-async-tile": ("uninitialized shared read", "ch06-cp-async-tile.cu:"),
    "ch07-swizzle": ("bank conflicts", "ldmatrix", "8-way"),
    "ch07-ldmatrix-lanes": ("mma.sync wants", "lanes 8-15"),
    "ch07-wait-depth": ("cp.async read before wait", "ch07-wait-depth.cu:"),
}


# ---- the registry and the files ---------------------------------------------------------------

def test_ids_are_unique_and_every_chapter_has_two():
    ids = [e.id for e in REGISTRY]
    assert len(ids) == len(set(ids)) == len(EXERCISES)
    per_chapter = Counter(e.chapter for e in REGISTRY)
    for chapter in range(1, 8):
        assert per_chapter[chapter] >= 2, f"chapter {chapter} has {per_chapter[chapter]} exercise(s)"
    for e in REGISTRY:
        assert re.fullmatch(rf"ch0{e.chapter}-[a-z0-9-]+", e.id), e.id
        assert e.title and e.hint and callable(e.checker)


def test_every_exercise_is_named_in_the_table():
    assert set(SKELETON_SAYS) == set(EXERCISES)
    readme = (exercises_dir() / "README.md").read_text()
    for eid in EXERCISES:
        assert f"`{eid}`" in readme, eid


def _gap(lines: list[str]) -> tuple[int, int]:
    starts = [i for i, line in enumerate(lines) if "TODO(exercise)" in line]
    ends = [i for i, line in enumerate(lines) if "---- end of exercise" in line]
    assert len(starts) == 1 and len(ends) == 1 and starts[0] < ends[0], "one marked gap"
    return starts[0], ends[0]


@pytest.mark.parametrize("eid", IDS)
def test_skeleton_and_solution_differ_only_inside_the_one_gap(eid):
    ex = EXERCISES[eid]
    skeleton, solution = ex.skeleton.read_text().splitlines(), ex.solution.read_text().splitlines()
    (s0, s1), (t0, t1) = _gap(skeleton), _gap(solution)
    assert skeleton[: s0 + 1] == solution[: t0 + 1], "the files differ before the gap"
    assert skeleton[s1:] == solution[t1:], "the files differ after the gap"
    assert skeleton[s0:s1] != solution[t0:t1]
    text = ex.skeleton.read_text()
    assert f"python -m attnlab exercises check {eid} exercises/{eid}.cu" in text, "says how to check itself"


# ---- solutions pass, skeletons fail, and say why ----------------------------------------------

@needs_cxx
@pytest.mark.parametrize("eid", IDS)
def test_solution_passes(eid):
    verdict = check(eid, EXERCISES[eid].solution)
    assert verdict.passed, verdict.line()
    assert verdict.message.startswith("passes") and "0 findings" in verdict.message
    assert "\n" not in verdict.message


@needs_cxx
@pytest.mark.parametrize("eid", IDS)
def test_untouched_skeleton_fails_saying_what_is_wrong(eid):
    verdict = check(eid, EXERCISES[eid].skeleton)
    assert not verdict.passed, verdict.line()
    assert not verdict.message.startswith("does not compile"), verdict.message
    assert "\n" not in verdict.message
    for says in SKELETON_SAYS[eid]:
        options = says if isinstance(says, tuple) else (says,)
        assert any(o in verdict.message for o in options), (options, verdict.message)
    assert verdict.hint == EXERCISES[eid].hint


# Typical mistakes, each planted in a copy of the solution: (exercise, old text, new text, what the
# verdict must say).
MISTAKES = [
    # the running max taken from the chunk alone: right while no later chunk is lower, e^100 when one is
    ("ch01-online-softmax", "const float m_new = fmaxf(m, chunk_max);", "const float m_new = chunk_max;",
     "the running max must never decrease"),
    ("ch01-causal-limit", "!active ? 0 : (causal ? row + 1 : L)", "causal ? row + 1 : L", "global out of bounds"),
    ("ch02-tile-barriers", "        __syncthreads();  // every row is done with the previous tile before it is overwritten\n",
     "", "race"),
    ("ch02-pad-q-tile", "Q_STRIDE = ROWS + 2;", "Q_STRIDE = ROWS + 1;", "2-way"),
    ("ch03-warp-reduce", "int off = width / 2;", "int off = 16;", "lanes of other groups leak in"),
    ("ch03-warp-reduce", "v += __shfl_xor_sync(FULL_MASK, v, off)", "v += __shfl_down_sync(FULL_MASK, v, off)",
     "the first lane of each group is right"),
    ("ch05-score-tile", "kk * MMA, T::KV_LD);", "kk * MMA, D);", "uninitialized shared read"),
    ("ch06-ring-barriers", "attn::bar_arrive(", "attn::bar_sync(", "the signalling side waits"),
    ("ch06-ring-barriers", "full_bar(s), THREADS); }", "full_bar(s), CONSUMER_THREADS); }", "deadlock"),
    # consumers wait for 128 where the producer arrives for 160: the mismatch, not the deadlock it causes
    ("ch06-ring-barriers", "consumer_acquire(int s) { attn::bar_sync(full_bar(s), THREADS)",
     "consumer_acquire(int s) { attn::bar_sync(full_bar(s), CONSUMER_THREADS)", "barrier count mismatch"),
    ("ch06-cp-async-tile", "(valid ? (long long)(kv0 + r) * D + col : 0);\n        attn::cp_async_16(attn::smem_u32((is_v ? v_dst : k_dst) + r * T::KV_LD + col), src, valid ? 16 : 0);",
     "(long long)(kv0 + r) * D + col;\n        attn::cp_async_16(attn::smem_u32((is_v ? v_dst : k_dst) + r * T::KV_LD + col), src, 16);",
     "global out of bounds"),
    ("ch07-swizzle", "((chunk ^ (row & 7)) << 4)", "((chunk ^ row) << 4)", "shared out of bounds"),
    ("ch07-wait-depth", "return STAGES - 2;", "return 0;", "waits for tile j+1"),
]


@needs_cxx
@pytest.mark.parametrize("eid, old, new, says", MISTAKES, ids=[f"{m[0]}:{m[3]}" for m in MISTAKES])
def test_a_typical_mistake_gets_the_message_that_teaches_it(tmp_path, eid, old, new, says):
    text = EXERCISES[eid].solution.read_text()
    assert old in text
    path = tmp_path / f"{eid}.cu"
    path.write_text(text.replace(old, new))
    verdict = check(eid, path)
    assert not verdict.passed and says in verdict.message, verdict.message


@needs_cxx
def test_a_compile_error_is_one_line_with_its_place_and_no_hint(tmp_path):
    path = tmp_path / "mine.cu"
    path.write_text(EXERCISES["ch03-warp-reduce"].skeleton.read_text().replace("return v;  // placeholder:", "return w;  //", 1))
    verdict = check("ch03-warp-reduce", path)
    assert not verdict.passed and verdict.hint == ""
    assert verdict.message.startswith("does not compile: mine.cu:") and "'w' was not declared" in verdict.message.replace("‘", "'").replace("’", "'")


@needs_cxx
def test_a_kernel_that_crashes_the_executor_is_a_verdict_in_a_child_process(tmp_path):
    path = tmp_path / "crash.cu"
    text = EXERCISES["ch03-warp-reduce"].solution.read_text()
    old = "    for (int off = width / 2; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);"
    path.write_text(text.replace(old, "    volatile int zero = 0; v += 100 / zero;"))
    verdict = check("ch03-warp-reduce", path, isolate=True)
    assert not verdict.passed and "crashed the executor (SIGFPE" in verdict.message, verdict.message


# ---- the command line -------------------------------------------------------------------------

def cli(capsys, *args):
    from attnlab.cli import main

    status = main(["exercises", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_lists_every_exercise_one_a_line(capsys):
    status, out, _ = cli(capsys)
    assert status == 0
    lines = out.splitlines()
    assert len(lines) == len(EXERCISES)
    for line, ex in zip(lines, EXERCISES.values()):
        assert line.split()[:2] == [ex.id, f"ch{ex.chapter}"] and ex.title in line


@needs_cxx
def test_cli_check_passes_a_solution_and_fails_a_skeleton_with_its_hint(capsys):
    root = exercises_dir()
    status, out, _ = cli(capsys, "check", "ch07-wait-depth", str(root / "solutions" / "ch07-wait-depth.cu"))
    assert status == 0 and out.startswith("ch07-wait-depth: passes"), out
    status, out, _ = cli(capsys, "check", "ch07-wait-depth", str(root / "ch07-wait-depth.cu"))
    lines = out.splitlines()
    assert status == 1 and len(lines) == 2, out
    assert lines[0].startswith("ch07-wait-depth: ") and "cp.async read before wait" in lines[0]
    assert lines[1] == f"hint: {EXERCISES['ch07-wait-depth'].hint}"


@pytest.mark.parametrize("args, says", [
    (["check", "ch03-warp-reduc", "x.cu"], "did you mean 'ch03-warp-reduce'?"),
    (["check", "ch03-warp-reduce", "no/such/file.cu"], "no file 'no/such/file.cu' in "),
    (["check"], "usage: python -m attnlab exercises check ID FILE"),
    (["check", "ch03-warp-reduce"], "usage: python -m attnlab exercises check ID FILE"),
    (["verify"], "invalid choice: 'verify'"),
])
def test_cli_usage_errors_are_one_line_and_exit_2(capsys, args, says):
    status, out, err = cli(capsys, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and says in lines[0], err
    assert "Traceback" not in err and out == ""


def test_cli_names_the_skeleton_from_the_directory_it_runs_in(capsys, monkeypatch):
    """A chapter notebook runs in book/: a repository-root path is missing there, and the line says
    where the skeleton is from book/, not the path that just failed."""
    book = exercises_dir().parent / "book"
    monkeypatch.chdir(book)
    status, out, err = cli(capsys, "check", "ch01-online-softmax", "exercises/ch01-online-softmax.cu")
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and out == "", err
    assert f"no file 'exercises/ch01-online-softmax.cu' in {book}" in lines[0], lines[0]
    assert "the skeleton of ch01-online-softmax is ../exercises/ch01-online-softmax.cu" in lines[0], lines[0]


def test_skeletons_live_where_the_registry_says(tmp_path):
    for ex in EXERCISES.values():
        assert ex.skeleton == exercises_dir() / f"{ex.id}.cu" and ex.skeleton.is_file()
        assert ex.solution.is_file()
    assert {p.stem for p in Path(exercises_dir()).glob("*.cu")} == set(EXERCISES)
    assert {p.stem for p in (Path(exercises_dir()) / "solutions").glob("*.cu")} == set(EXERCISES)


def test_each_chapter_page_ends_with_its_registered_exercises():
    """The chapters' closing exercise cells are what tools/exercise_cells.py writes from the
    registry: every exercise listed on its chapter's page, none that does not exist."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tools" / "exercise_cells.py"
    spec = importlib.util.spec_from_file_location("exercise_cells", path)
    cells = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cells)
    for chapter in cells.PAGES:
        text = cells.written(chapter)
        assert text == cells.cell_text(chapter), f"chapter {chapter}: run python tools/exercise_cells.py"
        nb = json.loads(cells.page_path(chapter).read_text())
        assert "".join(nb["cells"][-1]["source"]) == text, f"chapter {chapter}: the exercises close the page"
        for ex in REGISTRY:
            assert (f"`{ex.id}`" in text) == (ex.chapter == chapter)
            if ex.chapter == chapter:  # the skeleton linked from book/, where JupyterLab resolves it
                assert f"[`{ex.id}`](../exercises/{ex.id}.cu)" in text
                assert (cells.page_path(chapter).parent / ".." / "exercises" / f"{ex.id}.cu").is_file()
        headings = [line for cell in nb["cells"] if cell["cell_type"] == "markdown"
                    for line in "".join(cell["source"]).splitlines() if line.strip() == "## Exercises"]
        assert len(headings) == 1, f"chapter {chapter}: {len(headings)} '## Exercises' headings"
        assert 'ex.start("' in text and 'ex.check("' in text, "the route from the notebook"


# ---- from Python and a notebook: attnlab.exercises.start / check -------------------------------

@pytest.fixture
def my_dir(tmp_path, monkeypatch):
    """The working copies in a temporary folder, not the repository's my-exercises/."""
    from attnlab.exercises import workspace

    folder = tmp_path / "my-exercises"
    monkeypatch.setattr(workspace, "my_exercises_dir", lambda: folder)
    return folder


def test_import_is_light_and_names_check_and_start():
    import subprocess
    import sys

    import attnlab.exercises as ex

    assert callable(ex.check) and callable(ex.start)
    code = "import sys, attnlab.exercises; print(sorted(m for m in sys.modules if m.startswith('attnlab.exercises.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_start_copies_the_skeleton_once_and_says_how_to_check(my_dir, capsys):
    import attnlab.exercises as ex

    ex.start("ch03-warp-reduce")
    copy = my_dir / "ch03-warp-reduce.cu"
    assert copy.read_text() == EXERCISES["ch03-warp-reduce"].skeleton.read_text()
    out = capsys.readouterr().out
    assert str(copy) in out and 'attnlab.exercises.check("ch03-warp-reduce")' in out
    copy.write_text("// my work\n")
    ex.start("ch03-warp-reduce")  # never overwrites the reader's work
    assert copy.read_text() == "// my work\n"
    assert "kept as you left it" in capsys.readouterr().out


def test_the_repository_ignores_the_working_copies():
    lines = (exercises_dir().parent / ".gitignore").read_text().splitlines()
    assert "my-exercises/" in lines


def test_start_links_the_copy_relative_to_the_notebook(my_dir, monkeypatch, capsys):
    import IPython
    import IPython.display

    from attnlab.exercises import workspace

    class ZMQInteractiveShell:  # what get_ipython() is in a Jupyter kernel
        pass

    shown = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: ZMQInteractiveShell())
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj.data))
    monkeypatch.chdir(my_dir.parent)
    workspace.start("ch01-online-softmax")
    assert shown == ["Open [ch01-online-softmax.cu](my-exercises/ch01-online-softmax.cu) in the editor."]


def test_check_of_a_missing_file_is_one_line_that_names_the_skeleton(my_dir, monkeypatch):
    import attnlab.exercises as ex

    monkeypatch.chdir(exercises_dir().parent / "book")
    v = ex.check("ch01-online-softmax", "exercises/ch01-online-softmax.cu")
    assert not v.passed and "\n" not in str(v), str(v)
    assert "no file 'exercises/ch01-online-softmax.cu'" in v.message
    assert "is ../exercises/ch01-online-softmax.cu" in v.message
    v = ex.check("ch01-online-softmax")  # no working copy yet
    assert not v.passed and 'attnlab.exercises.start("ch01-online-softmax")' in v.message, v.message
    with pytest.raises(KeyError, match="did you mean 'ch01-online-softmax'"):
        ex.check("ch01-online-softmx")


@needs_cxx
def test_check_judges_the_working_copy_in_a_child_process(my_dir, monkeypatch, tmp_path):
    import attnlab.exercises as ex

    ex.start("ch07-wait-depth")
    v = ex.check("ch07-wait-depth")
    assert not v.passed and "cp.async read before wait" in v.message, v.message
    assert str(v) == f"{v.line()}\nhint: {EXERCISES['ch07-wait-depth'].hint}"
    (my_dir / "ch07-wait-depth.cu").write_text(EXERCISES["ch07-wait-depth"].solution.read_text())
    v = ex.check("ch07-wait-depth")
    assert v.passed and str(v) == v.line(), str(v)
    # a relative path is the current directory's; a crash is a verdict, this process lives on
    text = EXERCISES["ch03-warp-reduce"].solution.read_text()
    old = "    for (int off = width / 2; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);"
    (tmp_path / "crash.cu").write_text(text.replace(old, "    volatile int zero = 0; v += 100 / zero;"))
    monkeypatch.chdir(tmp_path)
    v = ex.check("ch03-warp-reduce", "crash.cu")
    assert not v.passed and "crashed the executor (SIGFPE" in v.message, v.message
