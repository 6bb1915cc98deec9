"""Records that no real run produced, or that no longer describe what would run now, are refused or
stale, each with its reason (attnlab.records.results, attnlab.records.provenance, attnlab.records.physics,
attnlab.records.fingerprint). Every test builds the tampered record or tree in a scratch repository."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from synthetic import git, new_test_record, synthetic_record

from attnlab.book import measured, page
from attnlab.kernels import registry
from attnlab.records.results import fresh_records, load_records, report_rows, verify, write_record


def _refusals(results) -> list[str]:
    return load_records()[1]


def _only(results):
    loaded, _ = load_records()
    assert len(loaded) == 1
    return loaded[0]


def _edit(repo, rel: str, extra: str, commit: bool = True):
    path = repo / rel
    path.write_text(path.read_text() + extra)
    if commit:
        git(repo, "add", rel)
        git(repo, "commit", "-q", "-m", f"edit {rel}", date="2020-01-03T00:00:00Z")


def test_a_real_shaped_record_is_shown(results):
    """The control: a record made by new_record in this repository and timed plausibly is shown."""
    write_record(synthetic_record())
    item = _only(results)
    assert item.refused == [] and not item.local and item.fresh == {"01_scalar"}
    assert verify().ok and len(fresh_records("bench")) == 1


def test_the_forgery_with_current_hashes_is_refused_naming_its_commit_date_and_time(results):
    """The reviewer's forgery: the current kernel hashes, commit deadbeef..., a harness of zeros,
    dated 2031, 01_scalar at 0.50 µs."""
    rec = synthetic_record(kernel_us=0.5)
    rec["git"]["commit"] = "deadbeef" * 5
    rec["harness"] = {m: "0" * 64 for m in rec["harness"]}
    rec["created_utc"] = "2031-01-01T00:00:00Z"
    write_record(rec)
    why = " ".join(_refusals(results))
    # Its tree digest is this checkout's, so it is bound to the commit holding that code (a rewritten
    # history names commits this one lacks, too): the name alone is no refusal. The rest is.
    assert "in the future" in why
    assert "below the least time this GPU can take" in why
    assert fresh_records("bench") == [] and report_rows() == []
    assert measured.latest_bench(page.by_key("L4")) is None
    assert not verify().ok


def test_an_unknown_commit_is_refused(results):
    """Neither the commit's name nor the digest of kernels/ and src/ is found in this history."""
    rec = synthetic_record()
    rec["git"]["commit"] = "0123456789" * 4
    rec["git"]["tree"] = "0" * 64
    write_record(rec)
    assert any("does not exist in this repository" in p for p in _refusals(results))


def test_a_commit_off_the_history_of_head_is_refused(results, scratch_repository):
    repo = scratch_repository
    git(repo, "checkout", "-q", "-b", "elsewhere")
    _edit(repo, "src/attnlab/gpu/bench.py", "\n# elsewhere\n")
    rec = synthetic_record()
    git(repo, "checkout", "-q", "main")
    write_record(rec)
    assert any("is not in the history of HEAD" in p for p in _refusals(results))


def test_a_tree_that_does_not_hash_to_its_claim_is_refused(results):
    rec = synthetic_record()
    rec["git"]["tree"] = "1" * 64
    write_record(rec)
    assert any("hashes to" in p and "not to the 111111111111 the record claims" in p for p in _refusals(results))


def test_hashes_that_are_not_those_of_the_commit_are_refused(results):
    rec = synthetic_record()
    rec["kernels"]["01_scalar"]["sha256"] = "f" * 64
    rec["harness"]["gpu.bench"] = "e" * 64
    write_record(rec)
    why = " ".join(_refusals(results))
    assert "01_scalar's source hash ffffffffffff is not that of kernels/01_scalar.cu at its commit" in why
    assert "harness src/attnlab/gpu/bench.py hash eeeeeeeeeeee is not that of the file at its commit" in why


def test_a_run_from_a_dirty_tree_is_kept_but_never_shown(results, scratch_repository):
    _edit(scratch_repository, "kernels/01_scalar.cu", "\n// an experiment\n", commit=False)
    rec = synthetic_record()
    assert rec["git"]["dirty"] is True
    write_record(rec)
    item = _only(results)
    assert item.local and item.refused == [] and item.fresh == set()
    assert fresh_records("bench") == [] and page.fresh_records("bench", "01_scalar") == []
    v = verify()
    assert v.ok and v.local == [str(item.path)] and "01_scalar" in v.missing


def test_a_record_dated_before_its_commit_is_refused(results):
    write_record(synthetic_record(created="2019-06-01T00:00:00Z"))
    assert any("before its commit" in p for p in _refusals(results))


def test_a_record_dated_in_the_future_is_refused_and_hides_nothing(results):
    write_record(synthetic_record(created="2026-01-01T00:00:00Z", kernel_us=50.0))
    write_record(synthetic_record(created="2099-01-01T00:00:00Z", kernel_us=90.0))
    assert any("in the future" in p for p in _refusals(results))
    [row] = [r for r in report_rows() if not r["causal"]]
    assert row["median_us"] == pytest.approx(50.0)


def test_freshest_follows_commit_order_not_the_clock(results, scratch_repository):
    """A record of the older commit dated later loses to one of the newer commit dated earlier."""
    write_record(synthetic_record(created="2026-06-01T00:00:00Z", kernel_us=90.0))
    _edit(scratch_repository, "src/attnlab/cli.py", "\n# a commit that changes no number\n")
    write_record(synthetic_record(created="2026-01-01T00:00:00Z", kernel_us=50.0))
    rows = [r for r in report_rows() if not r["causal"]]
    assert [r["median_us"] for r in rows] == [pytest.approx(50.0)]
    assert verify().ok


@pytest.mark.parametrize("us,needle", [
    (0.5, "below the least time this GPU can take"),   # 14x under the L4's floor at the mission shape
])
def test_an_impossible_time_is_refused_naming_the_case(results, us, needle):
    write_record(synthetic_record(kernel_us=us))
    why = " ".join(_refusals(results))
    assert needle in why and "cases[0] ((1, 8, 512, 64), causal=False) kernel 01_scalar device" in why


def test_a_matmul_above_the_peak_is_refused(results):
    rec = synthetic_record()
    rec["ceilings"]["matmul"]["tflops"] = 1073.0
    write_record(rec)
    assert any("ceilings.matmul: 1073.0 TFLOP/s is over the L4's peak 121" in p for p in _refusals(results))


def test_a_median_its_samples_do_not_give_is_refused(results):
    rec = synthetic_record()
    rec["cases"][0]["kernels"]["01_scalar"]["device"]["median_us"] = 10.0
    rec["cases"][1]["kernels"]["01_scalar"]["device"].pop("samples_us")
    write_record(rec)
    why = " ".join(_refusals(results))
    assert "median_us 10.0 is not what its samples give" in why and "no raw samples" in why


def test_a_failed_check_kept_as_a_time_is_refused(results):
    rec = synthetic_record()
    rec["cases"][0]["kernels"]["01_scalar"]["check"]["passed"] = False
    with pytest.raises(ValueError, match="failed its check but carries a time"):
        write_record(rec)  # never written ...
    path = results / "test-gpu" / "20260101T000000Z-bench.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))  # ... and refused when put there by hand
    assert any("failed its check but carries a time" in p for p in _refusals(results))
    assert fresh_records("bench") == []


def test_a_failed_check_without_a_time_is_shown_as_failed(results):
    rec = synthetic_record()
    entry = rec["cases"][0]["kernels"]["01_scalar"]
    entry["check"].update(passed=False, reason="max error 0.3 > tolerance")
    del entry["device"], entry["host"]
    write_record(rec)
    assert _refusals(results) == []
    failed = [r for r in report_rows() if not r["check_passed"]]
    assert [(r["median_us"], r["speedup_vs_sdpa"], r["tflops"]) for r in failed] == [(None, None, None)]
    text = measured.measured_sentence(fresh_records("bench")[0], "01_scalar")
    assert "FAILED its check" in text and "took" not in text


def test_an_edited_harness_file_makes_exactly_its_kinds_records_stale(results, scratch_repository):
    write_record(synthetic_record())
    check = new_test_record("check", [registry.get("01_scalar", "sm_89")], {"seeds": [0]})
    check["cases"] = [{"kernel": "01_scalar", "shape": [1, 8, 512, 64], "causal": False, "seed": 0,
                       "passed": True, "max_err": 1e-4}]
    write_record(check)
    _edit(scratch_repository, "src/attnlab/gpu/bench.py", "\nTARGET_REPLAY_US = 30.0  # a faster timer\n")
    loaded, problems = load_records()
    assert problems == []
    stale = {item.record["kind"]: item.stale["01_scalar"] for item in loaded}
    assert stale["bench"] == ["harness module src/attnlab/gpu/bench.py changed"] and stale["check"] == []
    v = verify()
    assert v.ok and not v.strict_ok and any("(bench) is stale: harness module src/attnlab/gpu/bench.py changed" in p
                                            for p in v.stale)


def test_an_edited_launcher_makes_only_its_kernels_stale(results, scratch_repository):
    write_record(synthetic_record(kernel="01_scalar"))
    write_record(synthetic_record(kernel="04_cublas_hybrid"))
    _edit(scratch_repository, "src/attnlab/gpu/hybrid.py", "\n# another way to call cuBLAS\n")
    loaded, problems = load_records()
    stale = {kid: why for item in loaded for kid, why in item.stale.items()}
    assert problems == [] and stale["01_scalar"] == []
    assert stale["04_cublas_hybrid"][0].startswith("its source changed")  # the launcher is one of its sources
    assert stale["04_cublas_hybrid"][-1] == "harness module src/attnlab/gpu/hybrid.py changed"


def test_an_edited_compile_flag_makes_records_stale(results, monkeypatch):
    import attnlab.kernels.compile

    write_record(synthetic_record())
    monkeypatch.setattr(attnlab.kernels.compile, "NVCC_FLAGS", ("-std=c++17", "-O2", "-lineinfo"))
    [why] = _only(results).stale.values()
    assert why and "its build's flags changed" in why[0] and "-O2" in why[0]


def test_another_patch_build_of_the_same_release_is_the_same_toolchain(results, monkeypatch):
    """A GPU image's nvcc may be another patch build of the release this environment pins."""
    import attnlab.records.fingerprint

    rec = synthetic_record()
    release = rec["kernels"]["01_scalar"]["build"]["compiler"].rsplit(".", 1)[0]
    write_record(rec)
    monkeypatch.setattr(attnlab.records.fingerprint, "toolchain_now", lambda: ("nvcc", f"{release}.999"))
    assert _only(results).fresh == {"01_scalar"}


def test_another_toolchain_makes_records_stale(results, monkeypatch):
    import attnlab.records.fingerprint

    rec = synthetic_record()
    write_record(rec)
    monkeypatch.setattr(attnlab.records.fingerprint, "toolchain_now", lambda: ("nvcc", "nvcc 13.9.0"))
    [why] = _only(results).stale.values()
    assert why == [f"its build's compiler changed ({rec['kernels']['01_scalar']['build']['compiler']} "
                   "then, nvcc 13.9.0 now)"]


def test_a_changed_launch_geometry_makes_exactly_that_kernels_records_stale(results, monkeypatch):
    write_record(synthetic_record(kernel="01_scalar"))
    write_record(synthetic_record(kernel="02_block_tiling"))
    spec = registry.KERNELS["01_scalar"]
    monkeypatch.setitem(registry.KERNELS, "01_scalar", dataclasses.replace(
        spec, grid=lambda s: (-(-s.L // 64), s.B * s.H, 1)))
    loaded, _ = load_records()
    stale = {kid: why for item in loaded for kid, why in item.stale.items()}
    assert stale["02_block_tiling"] == [] and any("launch geometry" in w for w in stale["01_scalar"])


def _retune(repo, rel: str, old: str, new: str):
    path = repo / rel
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    git(repo, "commit", "-q", "-am", f"retune {rel}", date="2020-01-03T00:00:00Z")


def test_a_changed_source_makes_its_records_stale_not_refused(results, scratch_repository):
    write_record(synthetic_record())
    _retune(scratch_repository, "kernels/01_scalar.cu", "KEY_CHUNK = 8;", "KEY_CHUNK = 4;")
    item = _only(results)
    why = item.stale["01_scalar"]
    assert item.refused == [] and why[0].startswith("its source changed")
    assert "its sm_89 code changed (attn_fwd_01_scalar)" in why[0]
    assert fresh_records("bench") == []


@pytest.mark.parametrize("header,new_file", [("scalar_notes.cuh", True), ("swizzle.cuh", False)])
def test_a_header_joining_a_kernel_after_its_record_keeps_it_bound(results, scratch_repository, monkeypatch,
                                                                  header, new_file):
    """The record's hash is over the headers its kernel had then: a header the kernel includes
    later (a new file, or one the repository already held) leaves the record bound to its commit,
    and fresh where the kernel still compiles to the code the record ran."""
    write_record(synthetic_record())
    if new_file:
        (scratch_repository / "kernels" / header).write_text("// notes for a later step\n#pragma once\n")
        git(scratch_repository, "add", f"kernels/{header}")
    _retune(scratch_repository, "kernels/01_scalar.cu", '#include "common.cuh"',
            f'#include "common.cuh"\n#include "{header}"')
    spec = registry.KERNELS["01_scalar"]
    monkeypatch.setitem(registry.KERNELS, "01_scalar", dataclasses.replace(
        spec, extra_sources=(*spec.extra_sources, header)))
    item = _only(results)
    assert item.refused == [] and item.fresh == {"01_scalar"}
    assert verify().ok


@pytest.mark.parametrize("deleted", [False, True])
def test_a_header_leaving_a_kernel_after_its_record_keeps_it_bound(results, scratch_repository, monkeypatch,
                                                                  deleted):
    """The record's hash is over a header the kernel no longer includes (its spec no longer names
    it; the file kept or deleted): the commit's source still includes it, so the record stays bound
    to its commit, and fresh where the kernel compiles to the code the record ran."""
    repo, header = scratch_repository, "scalar_notes.cuh"
    (repo / "kernels" / header).write_text("// notes for this step\n#pragma once\n")
    git(repo, "add", f"kernels/{header}")
    _retune(repo, "kernels/01_scalar.cu", '#include "common.cuh"', f'#include "common.cuh"\n#include "{header}"')
    spec = registry.KERNELS["01_scalar"]
    monkeypatch.setitem(registry.KERNELS, "01_scalar", dataclasses.replace(
        spec, extra_sources=(*spec.extra_sources, header)))
    write_record(synthetic_record())
    monkeypatch.setitem(registry.KERNELS, "01_scalar", spec)
    if deleted:
        git(repo, "rm", "-q", f"kernels/{header}")
    _retune(repo, "kernels/01_scalar.cu", f'\n#include "{header}"', "")
    item = _only(results)
    assert item.refused == [] and item.fresh == {"01_scalar"}
    assert verify().ok


def test_a_hash_over_a_header_the_commit_did_not_hold_is_refused(results, scratch_repository):
    """Leaving later headers out of the hash binds only what the commit held: the source with
    other contents of its header is no version of it."""
    from attnlab.kernels.sources import digest_named

    rec = synthetic_record()
    source = (scratch_repository / "kernels" / "01_scalar.cu").read_bytes()
    rec["kernels"]["01_scalar"]["sha256"] = digest_named([("01_scalar.cu", source), ("common.cuh", b"// other\n")])
    write_record(rec)
    assert any("01_scalar's source hash" in why for why in _refusals(results))


def test_a_source_edit_that_compiles_to_the_same_code_keeps_its_records_fresh(results, scratch_repository):
    """A comment, or a new function beside the measured ones, leaves every function the record's
    binary held as it was: the GPU would run the same code."""
    write_record(synthetic_record())
    _edit(scratch_repository, "kernels/01_scalar.cu",
          '\n// a later step\nextern "C" __global__ void attn_fwd_01_later(int* x) { *x = 2; }\n')
    assert _only(results).fresh == {"01_scalar"} and len(fresh_records("bench")) == 1
    _edit(scratch_repository, "kernels/common.cuh", "\n// a note on the helpers\n")
    assert _only(results).fresh == {"01_scalar"}


def test_a_source_edit_is_judged_by_code_only_where_nothing_else_changed(results, scratch_repository):
    """Where a harness module changed too, the kernel is stale without building it twice, and the
    source is named first among the reasons."""
    write_record(synthetic_record())
    _edit(scratch_repository, "kernels/01_scalar.cu", "\n// tuned\n")
    _edit(scratch_repository, "src/attnlab/gpu/bench.py", "\n# elsewhere\n")
    why = _only(results).stale["01_scalar"]
    assert why[0].startswith("its source changed") and "code" not in why[0]
    assert why[1] == "harness module src/attnlab/gpu/bench.py changed"


def test_a_copy_without_git_binds_only_its_stamped_commit(results, scratch_repository, monkeypatch):
    """A GPU machine's copy of the tree (no .git) knows the commit scripts/gpu_prepare.sh stamped,
    and only while its files still hash to the stamp."""
    import shutil

    from attnlab.records.provenance import tree_digest

    repo = scratch_repository
    head = git(repo, "rev-parse", "HEAD")
    when = git(repo, "show", "-s", "--format=%ct", "HEAD")
    shutil.rmtree(repo / ".git")
    monkeypatch.setenv("ATTNLAB_GIT_COMMIT", head)
    monkeypatch.setenv("ATTNLAB_GIT_TIME", when)
    monkeypatch.setenv("ATTNLAB_GIT_DIRTY", "0")
    monkeypatch.setenv("ATTNLAB_GIT_TREE", tree_digest(repo))
    rec = synthetic_record()
    assert rec["git"] == {"commit": head, "tree": tree_digest(repo), "dirty": False}
    write_record(rec)
    assert _only(results).fresh == {"01_scalar"}
    other = copy.deepcopy(rec)
    other["git"]["commit"] = "ab" * 20
    write_record(other)
    assert any("not the one this copy of the tree was stamped with" in p for p in _refusals(results))
    _edit(repo, "kernels/01_scalar.cu", "\n// edited on the GPU machine\n", commit=False)
    assert any("changed since it was stamped" in p for p in _refusals(results))


def test_the_committed_results_folder_holds_no_record_of_a_test_gpu():
    """Synthetic records live in scratch folders only."""
    from attnlab.paths import results_dir

    for path in results_dir().rglob("*.json"):
        assert "TEST GPU" not in json.loads(path.read_text())["gpu"]["name"], path


def _put(results, rec):
    """A record placed by hand (write_record refuses malformed ones)."""
    from attnlab.records.results import seal

    seal(rec)
    path = results / "test-gpu" / f"{len(list(results.rglob('*.json')))}-by-hand.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


def test_search_records_need_samples_behind_each_time(results, monkeypatch):
    from test_search import _search_record

    rec, _ = _search_record(monkeypatch)
    ok = [c for c in rec["cases"] if c["status"] == "ok" and c["time_us"] == 60.0]  # neither best nor default
    ok[0]["time_us"] = 61.0
    ok[1]["device"].pop("samples_us")
    _put(results, rec)
    why = " ".join(_refusals(results))
    assert "is not its timing's median" in why and "no raw samples" in why


def test_a_search_summary_of_its_own_numbers_is_refused(results, monkeypatch):
    from test_search import _search_record

    rec, _ = _search_record(monkeypatch)
    rec["search"]["best"]["time_us"] = 0.0001
    rec["search"]["default"]["time_us"] = 1e9
    _put(results, rec)
    why = " ".join(_refusals(results))
    assert "is not the fastest timed case" in why and "search.default's time 1000000000.0 is not its case's" in why
    from attnlab.gpu import search
    assert search.best_configs() == {}


def test_a_search_case_timed_without_a_passed_check_is_refused(results, monkeypatch):
    from test_search import _search_record

    rec, _ = _search_record(monkeypatch)
    next(c for c in rec["cases"] if c["status"] == "ok")["check"]["passed"] = False
    _put(results, rec)
    assert any("timed without a passed check" in p for p in _refusals(results))


@pytest.mark.parametrize("where,value,needle", [
    (("gpu", "name"), ["L4"], "gpu.name is not a str"),
    (("cases", 0, "shape"), [1, 8, 0, 64], "is not four positive integers"),
    (("cases", 0, "kernels", "01_scalar", "check", "passed"), "no", "has no check"),
    (("ceilings", "copy", "gbps"), 9000.0, "is not what its size and timing give"),
])
def test_odd_fields_are_named(results, where, value, needle):
    rec = synthetic_record()
    node = rec
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    _put(results, rec)
    assert any(needle in p for p in _refusals(results)), _refusals(results)


def test_a_passed_check_without_a_time_is_refused(results):
    rec = synthetic_record()
    del rec["cases"][0]["kernels"]["01_scalar"]["device"]
    _put(results, rec)
    assert any("passed its check but has no device time" in p for p in _refusals(results))


def test_the_launch_fingerprint_is_of_the_records_own_gpu(results):
    """07_mma on an H100 (sm_90 tiles, 132 SMs: the launcher splits the keys at the mission shape)
    is fresh from this machine without a GPU; a record claiming the L4's SM count for the same
    launches is not."""
    write_record(synthetic_record(kernel="07_mma", gpu="NVIDIA H100 80GB HBM3", cc="9.0", sms=132))
    assert _only(results).fresh == {"07_mma"}
    path = _only(results).path
    rec = json.loads(path.read_text())
    rec["gpu"]["sm_count"] = 58
    path.write_text(json.dumps(rec))
    assert any("launch geometry" in w for w in _only(results).stale["07_mma"])


def test_an_ignored_file_leaves_the_tree_digest_alone(results, scratch_repository):
    (scratch_repository / ".gitignore").write_text("*.cubin\n")
    (scratch_repository / "kernels" / "stray.cubin").write_bytes(b"\0")
    rec = synthetic_record()
    assert rec["git"]["dirty"] is False
    write_record(rec)
    assert _only(results).fresh == {"01_scalar"}




def test_a_field_of_the_wrong_type_deep_inside_is_named_not_a_crash(results):
    rec = synthetic_record()
    rec["cases"][0]["sdpa"] = ["flash"]
    path = results / "test-gpu" / "20260101T000000Z-bench.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(rec))
    assert any("refused: malformed" in p for p in _refusals(results))
    assert not verify().ok


@pytest.mark.parametrize("named", ["older", "unknown"])
def test_a_record_calling_itself_dirty_is_bound_by_its_tree(results, scratch_repository, named):
    """A GPU lease's copy came with the repository as last landed (its .git at an older commit, the
    stamped one missing), so the record names that older commit and calls itself dirty; or the
    history was rewritten and the name is unknown. Its digest is this commit's kernels/ and src/: it
    is shown, under this commit."""
    rec = synthetic_record()
    real = rec["git"]["commit"]
    other = git(scratch_repository, "rev-parse", "HEAD~1") if named == "older" else "abcdef01" * 5
    rec["git"].update(commit=other, dirty=True)
    write_record(rec)
    item = _only(results)
    assert item.refused == [] and not item.local and item.fresh == {"01_scalar"}
    (shown,) = fresh_records("bench")
    assert shown["git"]["commit"] == real and shown["git"]["recorded_commit"] == other
    assert "uncommitted" not in measured.record_label(shown)

