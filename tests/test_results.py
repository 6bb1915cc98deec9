import json

import pytest

from attnlab.records.results import (gpu_slug, load_records, report_rows, validate_record, verify,
                             write_record)
from synthetic import synthetic_record


def test_good_record_is_valid():
    assert validate_record(synthetic_record()) == []


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r.pop("gpu"), "gpu"),
    (lambda r: r["gpu"].pop("driver"), "gpu.driver"),
    (lambda r: r.update(kind="guess"), "kind"),
    (lambda r: r.update(created_utc="yesterday"), "created_utc"),
    (lambda r: r["kernels"]["01_scalar"].update(sha256="abc"), "sha256"),
    (lambda r: r["cases"][0].pop("sdpa"), "lacks sdpa"),
    (lambda r: r["cases"][0]["kernels"].update({"02_other": {}}), "no hash"),
])
def test_malformed_records_are_named(mutate, needle):
    rec = synthetic_record()
    mutate(rec)
    assert any(needle in p for p in validate_record(rec))


def test_write_refuses_malformed(results):
    rec = synthetic_record()
    rec.pop("git")
    with pytest.raises(ValueError, match="malformed"):
        write_record(rec)


def test_roundtrip_and_fresh(results):
    path = write_record(synthetic_record())
    assert path.parent.name == gpu_slug("TEST GPU (NVIDIA L4 table entry)")
    loaded, problems = load_records()
    assert problems == [] and len(loaded) == 1
    v = verify()
    assert v.ok and [kid for _, kid, _ in v.fresh] == ["01_scalar"]


def test_stale_kernel_hash_awaits_a_gpu_and_fails_strict_verification(results):
    write_record(synthetic_record(older_source=True))
    v = verify()
    assert v.ok and not v.strict_ok and v.problems == []
    assert any("01_scalar" in p and "measure it again" in p for p in v.stale)
    assert "01_scalar" in v.missing and v.fresh == []


def test_newer_fresh_record_supersedes_a_stale_one(results):
    write_record(synthetic_record(created="2026-01-01T00:00:00Z", older_source=True))
    write_record(synthetic_record(created="2026-02-01T00:00:00Z"))
    v = verify()
    assert v.strict_ok and v.superseded == 1 and v.stale == []


def test_unreadable_record_fails(results):
    (results / "junk").mkdir(parents=True)
    (results / "junk" / "bad.json").write_text("{not json")
    assert not verify().ok


def test_report_rows_compare_with_fastest_sdpa(results):
    write_record(synthetic_record(kernel_us=40.0))
    rows = report_rows()
    assert len(rows) == 2
    row = rows[0]
    assert row["sdpa_backend"] == "flash"
    assert row["speedup_vs_sdpa"] == pytest.approx(20.0 / 40.0)
    assert row["check_passed"] is True
    assert row["tflops"] == pytest.approx(4 * 8 * 512 ** 2 * 64 / (row["median_us"] * 1e-6) / 1e12)
    assert row["share_of_peak"] == pytest.approx(row["tflops"] / 121.0)  # the name matches the L4 entry
    assert row["share_of_matmul"] == pytest.approx(row["tflops"] / 100.0, rel=1e-3)


def test_stale_records_stay_out_of_reports(results):
    write_record(synthetic_record(older_source=True))
    assert report_rows() == []


def test_committed_records_verify():
    """What is committed under results/ is read in full, bound to this repository, physical, made
    from committed trees, and fresh where it is the latest of its GPU, kind and kernel."""
    from attnlab.paths import results_dir

    files = sorted(results_dir().rglob("*.json"))
    if not files:
        pytest.skip("no record is committed under results/: nothing to verify")
    loaded, problems = load_records()
    assert problems == [] and len(loaded) == len(files)
    assert [str(item.path) for item in loaded if item.local] == [], "a committed record of uncommitted changes"
    v = verify()
    assert v.ok, "\n".join(v.problems)


def test_record_files_are_sorted_json(results):
    path = write_record(synthetic_record())
    text = path.read_text()
    assert json.loads(text)["kind"] == "bench" and text.endswith("\n")


def test_records_of_one_second_never_overwrite_each_other(tmp_path, scratch_repository):
    """A GPU session's parallel check and sanitize processes finish within the same second."""
    first = write_record(synthetic_record(), tmp_path)
    second = write_record(synthetic_record(), tmp_path)
    assert first != second and first.exists() and second.exists()
    assert first.name == "20260101T000000Z-bench-01_scalar.json"
    assert second.name == "20260101T000000Z-bench-01_scalar-2.json"
