"""load_records judges the records once per process, and again as soon as anything it read changed:
a page that asks for records twenty times pays for one judgment, and never reads an old one."""
from __future__ import annotations

import json

import pytest
from synthetic import git, synthetic_record

import attnlab.records.results as results_module
from attnlab.records.results import load_records, write_record


@pytest.fixture
def judged(monkeypatch):
    """The paths of the records judged so far, one entry per judgment of one record."""
    seen: list[str] = []
    assess = results_module.assess

    def counting(path, rec, now=None):
        seen.append(path.name)
        return assess(path, rec, now)

    monkeypatch.setattr(results_module, "assess", counting)
    return seen


def _stale(loaded) -> dict[str, list[str]]:
    return {f"{item.record['kind']} {kid}": why for item in loaded for kid, why in item.stale.items()}


def test_records_are_judged_once_while_nothing_changes(results, judged):
    write_record(synthetic_record())
    first, problems = load_records()
    second, _ = load_records()
    assert len(judged) == 1 and problems == []
    assert [item.path for item in second] == [item.path for item in first] and second[0] is first[0]
    second.clear()  # the lists handed out are the caller's own
    assert len(load_records()[0]) == 1 and len(judged) == 1


def test_a_new_record_and_a_rewritten_one_are_judged_again(results, judged):
    path = write_record(synthetic_record())
    load_records()
    write_record(synthetic_record(kernel="04_cublas_hybrid"))
    assert len(load_records()[0]) == 2 and len(judged) == 3  # both again: the order is over all of them
    # The same number of bytes: only the file's time tells that it changed.
    text = path.read_text()
    tflops = str(json.loads(text)["ceilings"]["matmul"]["tflops"])
    over_the_peak = "9" * len(tflops)
    path.write_text(text.replace(f'"tflops": {tflops}', f'"tflops": {over_the_peak}', 1))
    assert path.read_text() != text and len(path.read_text()) == len(text)
    _, problems = load_records()
    assert len(judged) == 5 and len(problems) == 1 and path.name in problems[0] and "over the L4's peak" in problems[0]


def test_an_edit_of_the_working_tree_and_a_new_commit_are_judged_again(results, scratch_repository, judged):
    write_record(synthetic_record())
    assert _stale(load_records()[0]) == {"bench 01_scalar": []}
    harness = scratch_repository / "src/attnlab/gpu/bench.py"
    harness.write_text(harness.read_text() + "\nTARGET_REPLAY_US = 30.0  # a faster timer\n")
    assert _stale(load_records()[0]) == {"bench 01_scalar": ["harness module src/attnlab/gpu/bench.py changed"]}
    git(scratch_repository, "add", "src/attnlab/gpu/bench.py")
    git(scratch_repository, "commit", "-q", "-m", "a faster timer", date="2020-01-03T00:00:00Z")
    # The working tree is as it was: only HEAD moved, and that is enough to judge again.
    assert _stale(load_records()[0]) == {"bench 01_scalar": ["harness module src/attnlab/gpu/bench.py changed"]}
    assert len(judged) == 3


def test_another_results_folder_is_judged_on_its_own(results, tmp_path, judged):
    write_record(synthetic_record())
    assert len(load_records()[0]) == 1
    assert load_records(tmp_path / "elsewhere") == ([], []) and len(judged) == 1
    assert len(load_records()[0]) == 1


def test_one_judgment_asks_git_for_head_once_and_the_next_asks_again(results, scratch_repository, monkeypatch):
    import attnlab.records.provenance as provenance

    for kernel in ("01_scalar", "02_block_tiling", "04_cublas_hybrid"):
        write_record(synthetic_record(kernel=kernel))
    asked = []
    ask = provenance._git

    def counting(root, *args, **kwargs):
        asked.append(args[:2])
        return ask(root, *args, **kwargs)

    monkeypatch.setattr(provenance, "_git", counting)
    assert len(load_records()[0]) == 3
    assert asked.count(("rev-parse", "HEAD")) == 1 and asked.count(("rev-parse", "--verify")) == 1
    git(scratch_repository, "commit", "-q", "--allow-empty", "-m", "later", date="2020-01-03T00:00:00Z")
    asked.clear()
    load_records()  # HEAD moved: asked again, and so judged again
    assert asked.count(("rev-parse", "HEAD")) == 1
    assert provenance.head() == git(scratch_repository, "rev-parse", "HEAD")  # outside a judgment: git's answer
