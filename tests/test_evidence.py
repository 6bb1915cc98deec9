"""import-evidence (attnlab.session.evidence): a session's archive round-trips into a checkout; a
record of other kernel sources, a path out of the archive and a notebook that is no page are
refused."""
from __future__ import annotations

import io
import json
import tarfile

from synthetic import synthetic_record

from attnlab.session import evidence, stages
from attnlab.records.results import verify


def _stage_folder(tmp_path, records=(), notebooks=(), rehearsal=False):
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    (work / "summary.json").write_text(json.dumps({"stage": "bench", "rehearsal": rehearsal, "gpu": "TEST GPU",
                                                   "seconds": 1.0, "steps": [
                                                       {"step": "probe-07_mma", "status": "fault"}]}))
    for i, rec in enumerate(records):
        path = work / "results" / "test-gpu" / f"2026010{i}T000000Z-bench.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec))
    for name, text in notebooks:
        (work / "book").mkdir(exist_ok=True)
        (work / "book" / name).write_text(text)
    return stages.pack(work, tmp_path / "out", "bench")


def test_a_stage_archive_round_trips_into_results(tmp_path, scratch_repository):
    archives = _stage_folder(tmp_path, records=[synthetic_record()])
    results, book = tmp_path / "results", tmp_path / "book"
    book.mkdir()
    got = evidence.import_archives(archives, results=results, book=book)
    assert got.refused == []
    assert [p.relative_to(results).as_posix() for p in got.records] == ["test-gpu/20260100T000000Z-bench.json"]
    assert verify(results).ok and verify(results).fresh
    assert evidence.stage_failures(got.summaries[0]) == ["bench: fault probe-07_mma"]


def test_a_record_of_other_sources_is_refused(tmp_path, scratch_repository):
    archives = _stage_folder(tmp_path, records=[synthetic_record(older_source=True)])
    got = evidence.import_archives(archives, results=tmp_path / "results", book=tmp_path)
    assert got.records == [] and not (tmp_path / "results").exists()
    assert len(got.refused) == 1 and "01_scalar is stale: its source changed" in got.refused[0]


def _nb(source: str, output: str = "") -> str:
    cell = {"cell_type": "code", "source": source, "metadata": {}, "execution_count": 1,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": output}]}
    return json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_executed_pages_are_taken_strangers_and_edited_cells_refused(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    (book / "ch01_scalar.ipynb").write_text(_nb("print(1)"))
    (book / "ch02_block_tiling.ipynb").write_text(_nb("print(2)"))
    archives = _stage_folder(tmp_path, notebooks=[("ch01_scalar.ipynb", _nb("print(1)", "1 on the GPU")),
                                                  ("ch02_block_tiling.ipynb", _nb("import os", "")),
                                                  ("stranger.ipynb", _nb("x"))])
    got = evidence.import_archives(archives, results=tmp_path / "results", book=book)
    assert "1 on the GPU" in (book / "ch01_scalar.ipynb").read_text()
    assert (book / "ch02_block_tiling.ipynb").read_text() == _nb("print(2)")
    assert not (book / "stranger.ipynb").exists()
    assert any("stranger.ipynb is not a page" in r for r in got.refused)
    assert any("cells differ from book/ch02_block_tiling.ipynb" in r for r in got.refused)


def test_a_rehearsals_archive_gives_nothing_unless_asked(tmp_path, scratch_repository):
    archives = _stage_folder(tmp_path, records=[synthetic_record()], rehearsal=True)
    got = evidence.import_archives(archives, results=tmp_path / "results", book=tmp_path)
    assert got.records == [] and any("rehearsal" in r for r in got.refused)
    got = evidence.import_archives(archives, results=tmp_path / "results", book=tmp_path, allow_rehearsal=True)
    assert len(got.records) == 1 and got.refused == []


def test_a_path_out_of_the_archive_is_refused(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        data = b"{}"
        info = tarfile.TarInfo("../escaped.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    got = evidence.import_archives([archive], results=tmp_path / "results", book=tmp_path)
    assert got.refused and not (tmp_path.parent / "escaped.json").exists()


def test_the_command_fails_on_a_refusal(tmp_path, monkeypatch, capsys, scratch_repository):
    monkeypatch.setenv("ATTNLAB_RESULTS", str(tmp_path / "results"))
    bad = _stage_folder(tmp_path, records=[synthetic_record(older_source=True)])
    assert evidence.main([str(a) for a in bad], run_nbval=False) == 1
    assert "REFUSED" in capsys.readouterr().err
