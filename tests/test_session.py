"""The staged GPU session (attnlab.session.stages, scripts/gpu_session.sh) without a GPU: the stages
and their minutes, the order of the kernels, the process isolation, the archives and what comes
back."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time

import pytest

from attnlab.session import carry, stages
from attnlab.kernels import registry
from attnlab.paths import repo_root
from attnlab.shapes import CH07_TARGET_SHAPES, Shape

ROOT = repo_root()


def test_list_shows_every_stage_with_minutes_under_the_lease():
    out = subprocess.run(["bash", "scripts/gpu_session.sh", "--list"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    for stage in stages.STAGES:
        assert re.search(rf"^{stage.name}\s+~{stage.minutes:g} min on an H100\s+\S", out, re.M), out
        # its builds included, all of them when nothing carried is of use on the GPU machine
        assert stage.step_minutes <= stage.minutes <= stage.worst_minutes
        assert stage.worst_minutes <= 8, f"{stage.name} is predicted past the 8 minutes a stage may take"
    # every stage of the plan within two leases of 15 minutes of device time, each less a cold start (a
    # minute or more: 1.5 counted)
    assert sum(s.minutes for s in stages.STAGES) <= 2 * (15 - 1.5)
    assert {"check", "bench", "sanitize", "book", "extras"} <= {s.name for s in stages.STAGES}


def test_riskiest_kernels_first_variants_last():
    order = [s.id for s in stages.risk_order()]
    assert sorted(order) == sorted(registry.KERNELS)
    assert order[:3] == ["07_mma", "06_warp_specialized", "05_wmma"]
    variants = [s.id for s in registry.select(None) if s.variant_of]
    assert set(variants) == {"07_mma_split2", "07_mma_split4", "07_mma_nosplit", "07_mma_two_barriers",
                             "07_mma_noswizzle", "07_mma_single_buffer", "07_mma_split_ctas", "07_mma_longest_first",
                             "07_mma_plain", "07_mma_two_row_blocks", "07_mma_across_heads",
                             "07_mma_rows_that_fill", "07_mma_even_split", "07_mma_lean", "07_mma_lean_across_heads",
                             "07_mma_lean_loop", "07_mma_whole_tiles", "07_mma_whole_tiles_across_heads",
                             "07_mma_whole_tile_copy", "07_mma_deferred_pv", "07_mma_deferred_pv_across_heads",
                             "07_mma_pv_a_tile_later", "07_mma_deferred_pv_two_rows", "07_mma_q_from_tile",
                             "07_mma_two_rows_at_d128"} | {
        k for k in registry.KERNELS if k.startswith("06_ws_")}
    assert order[-len(variants):] == [k for k in order if k in variants]


def test_check_and_sanitize_give_each_kernel_its_own_process():
    ctx = stages.Context()
    check = stages.plan_check(ctx)
    kernels = [s for s in check if s.kernel]
    assert [s.kernel for s in kernels] == [s.id for s in stages.risk_order()]
    assert all(s.argv[-1] == s.kernel and "check" in s.argv for s in kernels)
    # The GPU tests come after, without repeating the suite.
    assert check[-1].name == "pytest-gpu" and "not test_check_suite" in " ".join(check[-1].argv)
    sanitize = stages.plan_sanitize(ctx)
    assert len(sanitize) == len(registry.KERNELS) * 3
    assert {s.argv[-1] for s in sanitize} == {"memcheck", "racecheck", "synccheck"}


def test_bench_times_only_probed_kernels_at_chapter_7s_own_target_shapes():
    steps = stages.plan_bench(stages.Context())
    probes = [s for s in steps if s.name.startswith("probe-")]
    assert len(probes) == len(registry.KERNELS) and all("--probe" in s.argv for s in probes)
    timed = [s for s in steps if s.name.startswith("bench-")]
    assert timed and all("--only-probed" in s.argv for s in timed)
    assert steps.index(timed[0]) > max(steps.index(p) for p in probes)
    # The shapes chapter 7's pages time are the ones the stage times, and so are their kernels.
    from attnlab.book import climb

    assert climb.TARGET_SHAPES == list(CH07_TARGET_SHAPES)
    argv = next(s.argv for s in timed if s.name == "bench-ch07-targets")
    given = {Shape(*map(int, argv[i + 1:i + 5])) for i, a in enumerate(argv) if a == "--shape"}
    assert given == set(CH07_TARGET_SHAPES)
    timed_by_pages = set()
    for nb_path in sorted((ROOT / "book").glob("ch07*.ipynb")):
        nb = json.loads(nb_path.read_text())
        for cell in ("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"):
            for call in re.findall(r"page\.bench_at\((.*?), (?:climb\.)?TARGET_SHAPES", cell, re.S):
                assert "TARGET_SHAPES" in cell
                timed_by_pages |= set(eval(call, {"climb": climb}))  # the list the page passes
    assert timed_by_pages == set(stages.CH07_TARGET_KERNELS) == {a for a in argv if re.fullmatch(r"0\d_\w+", a)}
    assert {s.id for s in registry.select(None) if s.chapter == 7} <= timed_by_pages


def test_book_and_extras_execute_every_page_once_reusing_records():
    ctx = stages.Context()
    book, extras = stages.plan_book(ctx), stages.plan_extras(ctx)
    stems = {p.stem for p in (ROOT / "book").glob("*.ipynb")}
    # the book stage first takes the earlier stages' records into results/, then makes the pages'
    # executor counts (one step, every core), then the pages
    adopt, counts, book = book[0], book[1], book[2:]
    assert adopt.name == "book-adopt-records" and adopt.argv[1:] == ("-m", "attnlab.session.stages", "--adopt-records")
    assert counts.name == "book-counts" and counts.argv[1:] == ("-m", "attnlab.book.executor_view") and not counts.gpu
    names = [s.name.removeprefix("book-") for s in book + extras]
    assert sorted(names) == sorted(stems)
    assert {s.name.removeprefix("book-") for s in extras} == set(stages.MEASURING_PAGES)
    assert all(dict(s.env).get("ATTNLAB_REUSE_RECORDS") == "1" and s.alone for s in book + extras)
    # Default parameters, as nbval re-executes the pages: a cell printing quick's effect must match.
    assert not any("--full" in s.argv or "-p" in s.argv for s in book + extras)


def test_the_book_stage_adopts_the_records_earlier_stages_left_on_the_machine(tmp_path):
    root, results = tmp_path / "attnlab-session", tmp_path / "results"
    for stage, name in (("check", "a-check-07_mma.json"), ("bench", "b-bench.json"), ("sanitize", "c-sanitize.json")):
        (root / stage / "results" / "some-gpu").mkdir(parents=True)
        (root / stage / "results" / "some-gpu" / name).write_text(f'{{"from": "{stage}"}}')
    (root / "book" / "logs").mkdir(parents=True)  # a stage folder without records
    (results / "some-gpu").mkdir(parents=True)
    (results / "some-gpu" / "b-bench.json").write_text('{"from": "an import"}')  # already here: left alone
    taken = stages.adopt_records(root, results)
    assert sorted(p.name for p in taken) == ["a-check-07_mma.json", "c-sanitize.json"]
    assert json.loads((results / "some-gpu" / "b-bench.json").read_text()) == {"from": "an import"}
    assert json.loads((results / "some-gpu" / "c-sanitize.json").read_text()) == {"from": "sanitize"}


def test_stages_side_by_side_refuse_a_timing_stage(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_session.sh", "check+bench"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OUT": str(tmp_path / "out")})
    assert proc.returncode == 2 and "bench times kernels: run it alone" in proc.stderr
    assert not (tmp_path / "out").exists()  # refused before anything is made


@pytest.mark.parametrize("argv", [
    ["check", "07_mma"],
    ["check", "07_mma", "--probe", "--no-record"],
    ["sanitize", "06_warp_specialized", "--tool", "memcheck"],
    # the bench stage's timings as its plan writes them: every kernel, every shape in one run
    *[list(s.argv[3:]) for s in stages.plan_bench(stages.Context()) if s.name.startswith("bench-")],
])
def test_gpu_commands_of_the_plans_parse_and_refuse_cleanly_without_a_gpu(argv):
    proc = subprocess.run([sys.executable, "-m", "attnlab", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and stages.NO_GPU_LINE in proc.stderr, proc.stderr


def test_a_hang_and_a_fault_are_recorded_and_the_stage_goes_on(tmp_path):
    outcomes = stages.isolation_demo(tmp_path)
    assert [o.status for o in outcomes] == ["timeout", "fault", "ok"]
    assert outcomes[0].seconds < 15


def test_lone_steps_never_share_the_gpu(tmp_path):
    sleep = _py("import time; time.sleep(0.6)")
    t0 = time.monotonic()
    stages.run_steps([stages.Step(f"p{i}", sleep, 30) for i in range(3)], tmp_path, dict(os.environ), parallel=3)
    together = time.monotonic() - t0
    t0 = time.monotonic()
    stages.run_steps([stages.Step(f"a{i}", sleep, 30, alone=True) for i in range(3)], tmp_path, dict(os.environ),
                      parallel=3)
    alone = time.monotonic() - t0
    assert alone >= 1.8 and together < alone - 0.6


def test_classify():
    assert stages.classify(0, False, "", False, True) == "ok"
    assert stages.classify(-11, False, "Segmentation fault", False, True) == "crashed"
    assert stages.classify(1, False, "RuntimeError: CUDA error: an illegal memory access", False, True) == "fault"
    assert stages.classify(1, False, "AssertionError", False, True) == "failed"
    no_gpu = "attnlab check: no CUDA GPU here (torch.cuda.is_available() is False)"
    assert stages.classify(2, False, no_gpu, True, True) == "no gpu"
    assert stages.classify(2, False, no_gpu, False, True) == "failed"   # on a GPU machine it is a failure
    assert stages.classify(2, False, "usage: python -m attnlab", True, True) == "failed"
    assert stages.classify(None, True, "", False, True) == "timeout"


def _py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_a_stage_packs_one_archive_and_ends_with_its_failures(tmp_path):
    steps = [stages.Step("fine", _py("print('ok')"), 30, kernel="01_scalar"),
             stages.Step("broken", _py("import sys; print('boom'); sys.exit(3)"), 30, kernel="02_block_tiling"),
             stages.Step("record", _py("import os, pathlib; d = pathlib.Path(os.environ['ATTNLAB_RESULTS'], 'gpu');"
                                        "d.mkdir(parents=True); (d / 'r.json').write_text('{}')"), 30)]
    lines = []
    run = stages.run_stage("check", tmp_path / "out", work_root=tmp_path / "work", steps=steps, echo=lines.append)
    assert [o.status for o in run.outcomes] == ["ok", "failed", "ok"]
    assert [a.name for a in run.archives] == ["check.tar.gz"]
    with tarfile.open(run.archives[0]) as tar:
        names = set(tar.getnames())
        summary = json.loads(tar.extractfile("check/summary.json").read())
    assert {"check/summary.json", "check/logs/fine.log", "check/logs/broken.log",
            "check/results/gpu/r.json"} <= names
    assert [s["status"] for s in summary["steps"]] == ["ok", "failed", "ok"]
    last = lines[-1]
    assert "1 failed" in last and "broken" in last.splitlines()[-1] and "boom" in last.splitlines()[-1]
    assert stages.check_out(tmp_path / "out") == []


def test_no_step_starts_after_the_deadline(tmp_path):
    steps = [stages.Step(f"s{i}", _py("import time; time.sleep(0.5)"), 30, alone=True) for i in range(3)]
    run = stages.run_stage("check", tmp_path / "out", work_root=tmp_path / "work", steps=steps, deadline_s=0.2,
                            echo=lambda line: None)
    assert [o.status for o in run.outcomes] == ["ok", "not started", "not started"]


def test_a_large_stage_splits_into_archives_that_each_come_back(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "MAX_ARCHIVE_BYTES", 64 * 1024)
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "book").mkdir()
    for i in range(3):
        (work / "book" / f"p{i}.ipynb").write_bytes(bytes(range(256)) * 128)  # 32 KiB each
    (work / "summary.json").write_text('{"stage": "book"}')
    archives = stages.pack(work, tmp_path / "out", "book")
    assert len(archives) >= 2 and all(a.stat().st_size <= 64 * 1024 for a in archives)
    with_names = [set(tarfile.open(a).getnames()) for a in archives]
    assert set().union(*with_names) >= {f"book/book/p{i}.ipynb" for i in range(3)}
    # import-evidence reads each part's summary first: every part carries it.
    assert all("book/summary.json" in names for names in with_names)
    assert stages.check_out(tmp_path / "out") == []


def test_check_out_refuses_what_would_not_come_back(tmp_path):
    for i in range(9):
        (tmp_path / f"f{i}.log").write_text("x")
    (tmp_path / "bad name.txt").write_text("x")
    problems = stages.check_out(tmp_path)
    assert any("over the 8" in p for p in problems)
    assert any("bad name.txt" in p for p in problems)


def test_prepare_names_a_module_that_does_not_import(tmp_path, monkeypatch):
    from attnlab.session import prebuild

    monkeypatch.setitem(stages.STAGE_NEEDS, "check", (("attnlab", "no_such_module_here"), ()))
    monkeypatch.setitem(prebuild.SETS, "registered", lambda arch: [])
    monkeypatch.setattr(carry, "carried_archives", lambda root=None: [])
    problems, _ = stages.prepare("check", arch="sm_90")
    assert len(problems) == 1 and "no_such_module_here" in problems[0]


def test_no_step_runs_past_the_hard_end(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "MIN_STEP_S", 1)
    steps = [stages.Step("long", _py("import time; time.sleep(60)"), 50, alone=True),
             stages.Step("next", _py("print('late')"), 30, alone=True)]
    t0 = time.monotonic()
    run = stages.run_stage("check", tmp_path / "out", work_root=tmp_path / "work", steps=steps, deadline_s=1,
                            hard_end_s=3, echo=lambda line: None)
    assert [o.status for o in run.outcomes] == ["timeout", "not started"]
    assert time.monotonic() - t0 < 20
    assert json.loads(tarfile.open(run.archives[0]).extractfile("check/summary.json").read())["complete"]


def test_prepare_on_a_gpu_builds_for_the_gpus_target(tmp_path, monkeypatch):
    import attnlab.kernels.compile
    import attnlab.env
    import attnlab.gpus
    from attnlab.session import prebuild

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(attnlab.env, "has_gpu", lambda: True)
    monkeypatch.setattr(attnlab.kernels.compile, "_device_index", lambda device=None: 0)
    monkeypatch.setattr(attnlab.kernels.compile, "_device_arch", lambda index: "sm_90")
    monkeypatch.setattr(attnlab.gpus, "arch_at_hand", lambda: ("sm_90", "an H100's"))
    monkeypatch.setitem(stages.STAGE_NEEDS, "check", (("attnlab",), ()))
    monkeypatch.setattr(carry, "carried_archives", lambda root=None: [])
    asked = []
    monkeypatch.setitem(prebuild.SETS, "registered", lambda arch: asked.append(arch) or [])
    problems, notes = stages.prepare("check")
    assert asked == ["sm_90"] and any("0 of 0 builds" in n for n in notes), notes


def test_scripts_readme_stage_table_gives_the_minutes_list_predicts():
    """scripts/README.md quotes `gpu_session.sh --list`: a change to stages, kernels or the searched
    space that moves a prediction must move the table too, and it lists every stage, no other."""
    page = (ROOT / "scripts" / "README.md").read_text()
    for stage in stages.STAGES:
        found, worst = stages.build_seconds(stage.name)
        row = f"| `{stage.name}` | ~{stage.minutes:g} | {found:.0f} s ({worst:.0f} s) |"
        assert row in page, row
    rows = re.findall(r"^\| `(\w+)` \| ~[\d.]+ \|", page, re.M)
    assert rows == [s.name for s in stages.STAGES], rows
    assert f"predicts for an H100, {sum(s.minutes for s in stages.STAGES):.1f} in all" in page
    assert f"({sum(s.worst_minutes for s in stages.STAGES):.1f} minutes in all)" in page
    # the order of commands names each stage once, alone or side by side with another (a+b)
    named = [part for arg in re.findall(r"`bash scripts/gpu_session.sh ([\w+]+)`", page) for part in arg.split("+")]
    assert sorted(named) == sorted(s.name for s in stages.STAGES), named


def test_the_books_running_page_leaves_the_staged_session_to_scripts_readme():
    """The reader's page tells how to run the book on one's own GPU; the staged session's
    mechanics live in scripts/README.md, which the page names."""
    page = (ROOT / "book" / "running.md").read_text()
    for word in (r"\$OUT", r"\bcarry\b", r"\.whl\b", r"\bimport-evidence\b", r"\brehears", r"\blease"):
        assert not re.search(word, page), word
    assert "scripts/README.md" in page and (ROOT / "scripts" / "README.md").is_file()
