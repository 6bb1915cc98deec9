"""Appendix A without a GPU: the ncu command, the CSV parser and the profile records.

FORMAT SAMPLES, NOT MEASUREMENTS: the CSV texts below were written by hand from the layout that
`ncu --csv` documents (the default details page: one row per metric; and `--page raw`: one row per
kernel, a row of units under the header). Their numbers are invented to exercise the parser; they
describe no GPU and live only in this file (and, in one test, in a temporary folder).
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.gpu import profile
from attnlab.kernels import registry
from attnlab.env import has_gpu
from attnlab.records.results import validate_record, write_record
from attnlab.shapes import MISSION

# FORMAT SAMPLE (details page), with the ==PROF== lines ncu interleaves and a line the child printed.
SAMPLE_DETAILS = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "attn_fwd_07_mma_d64" - 0: 0%....50%....100% - 9 passes
==PROF== Profiling "attn_fwd_07_mma_d64" - 1: 0%....50%....100% - 9 passes
a line the child printed
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","11.11"
"0","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","gpu__time_duration.sum","usecond","22.22"
"0","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","","0"
"0","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","lts__t_bytes.sum","byte","1,234,567"
"0","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","launch__registers_per_thread","register/thread","151"
"1","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","dram__throughput.avg.pct_of_peak_sustained_elapsed","%","33.33"
"1","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","gpu__time_duration.sum","usecond","44.44"
"1","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum","","n/a"
"1","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","lts__t_bytes.sum","byte","7,654,321"
"1","4242","python3.12","127.0.0.1","attn_fwd_07_mma_d64","1","7","(128, 1, 1)","(8, 8, 1)","0","8.9","Command line profiler metrics","launch__registers_per_thread","register/thread","151"
'''

# FORMAT SAMPLE (--page raw): metric columns, a row of units, then one row per kernel.
SAMPLE_RAW = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","gpu__time_duration.sum","lts__t_bytes.sum"
"","","","","","","","usecond","Mbyte"
"0","4242","python3.12","127.0.0.1","attn_fwd_05_wmma","1","7","55.55","6.66"
"1","4242","python3.12","127.0.0.1","attn_fwd_05_wmma","1","7","77.77","8.88"
'''


def test_the_metrics_are_the_appendixs():
    wanted = {"sm__pipe_tensor_op_hmma_cycles_active", "dram__throughput", "lts__t_bytes",
              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st",
              "sm__warps_active", "launch__registers_per_thread"}
    assert wanted <= {name.split(".")[0] for name in profile.DEFAULT_METRICS}
    assert all(m.meaning and m.short for m in profile.METRICS.values())


def test_parse_details_page():
    kernels = profile.parse_ncu_csv(SAMPLE_DETAILS)
    assert [k["id"] for k in kernels] == [0, 1]
    k0, k1 = kernels
    assert k0["function"] == "attn_fwd_07_mma_d64" and k0["grid"] == "(8, 8, 1)" and k0["block"] == "(128, 1, 1)"
    assert k0["metrics"]["lts__t_bytes.sum"] == {"value": 1234567.0, "unit": "byte"}
    assert k0["metrics"]["gpu__time_duration.sum"]["value"] == 22.22
    assert k1["metrics"]["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]["value"] is None  # n/a
    assert k1["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == {"value": 33.33, "unit": "%"}


def test_parse_raw_page_and_nothing():
    k0, k1 = profile.parse_ncu_csv(SAMPLE_RAW)
    assert k0["function"] == "attn_fwd_05_wmma" and k0["metrics"]["lts__t_bytes.sum"] == {"value": 6.66, "unit": "Mbyte"}
    assert k1["metrics"]["gpu__time_duration.sum"]["value"] == 77.77
    assert profile.parse_ncu_csv("==PROF== nothing was profiled\n") == []
    assert profile._number("12.5") == 12.5 and profile._number("1,024") == 1024.0 and profile._number("n/a") is None


def test_ncu_command_profiles_only_the_kernels_entry():
    cmd = profile.ncu_command("07_mma", shape=MISSION, python="python")
    assert cmd[:2] == ["ncu", "--csv"] and "--metrics" in cmd
    # the key split follows the GPU the child runs on: every split's entry of D = 64, nothing else
    assert cmd[cmd.index("--kernel-name") + 1] == \
        "regex:^(attn_fwd_07_mma_d64|attn_fwd_07_mma_split2_d64|attn_fwd_07_mma_split4_d64)$"
    assert cmd[-8:] == ["-m", "attnlab", "profile", "--child", "07_mma", "--shape", "1", "8", "512", "64"][-8:]
    assert profile.entry_names("07_mma", MISSION._replace(D=128)) == ["attn_fwd_07_mma_d128", "attn_fwd_07_mma_split2_d128"]
    assert profile.entry_names("07_mma_nosplit") == ["attn_fwd_07_mma_d64"]
    assert profile.entry_names("04_cublas_hybrid") == ["attn_softmax_04_rows"]
    assert profile.entry_names("07_mma_split_ctas") == ["attn_fwd_07_mma_d64", "attn_fwd_07_mma_partial_d64", "attn_combine_07"]


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """An `ncu` on PATH that prints the details-page format sample: the pipeline around ncu, tested."""
    exe = tmp_path / "bin" / "ncu"
    exe.parent.mkdir()
    sample = tmp_path / "sample.csv"
    sample.write_text(SAMPLE_DETAILS)
    exe.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && echo 'ncu format sample' && exit 0\ncat {sample}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    return exe


def test_profile_kernel_maps_launches_to_causal_flags(fake_ncu):
    cases = profile.profile_kernel("07_mma")
    assert [c["causal"] for c in cases] == [False, True]
    assert cases[1]["metrics"]["lts__t_bytes.sum"]["value"] == 7654321.0
    assert profile.ncu_version() == "ncu format sample"


def test_profile_record_validates_and_reads_back(results, fake_ncu):
    from synthetic import new_test_record

    from attnlab.kernels.registry import get
    from attnlab.records.results import seal

    rec = new_test_record("profile", [get("01_scalar")], {"metrics": list(profile.DEFAULT_METRICS)},
                          created="2026-01-04T00:00:00Z")
    rec["cases"] = profile.profile_kernel("07_mma")
    assert validate_record(rec) != []                       # 07_mma has no hash in this record
    rec = new_test_record("profile", [get("07_mma", "sm_89")], {"metrics": list(profile.DEFAULT_METRICS)},
                          created="2026-01-04T00:00:00Z")
    rec["cases"] = profile.profile_kernel("07_mma")
    assert validate_record(seal(rec)) == []
    write_record(rec)
    rows = profile.fresh_profile_rows()
    assert [(r["kernel"], r["causal"]) for r in rows] == [("07_mma", False), ("07_mma", True)]
    assert rows[0]["L2 bytes"] == 1234567.0 and rows[0]["registers"] == 151.0
    broken = dict(rec, cases=[dict(rec["cases"][0], metrics="no")])
    assert any("metrics" in p for p in validate_record(broken))


def test_sanitize_rows_read_fresh_records(results):
    from synthetic import new_test_record

    from attnlab.kernels.registry import get

    rec = new_test_record("sanitize", [get("01_scalar")], {"tools": ["memcheck", "racecheck"]})
    rec["cases"] = [{"kernel": "01_scalar", "tool": t, "clean": True, "errors": 0} for t in ("memcheck", "racecheck")]
    write_record(rec)
    assert [(r["tool"], r["clean"]) for r in profile.fresh_sanitize_rows()] == [("memcheck", True), ("racecheck", True)]


@pytest.mark.skipif(has_gpu(), reason="this case is about a machine without a GPU")
def test_cli_profile_refuses_without_gpu_and_shows_the_command():
    out = subprocess.run([sys.executable, "-m", "attnlab", "profile", "07_mma"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "no CUDA GPU" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr  # the refusal; what it would run is output
    assert "--kernel-name regex:^(attn_fwd_07_mma_d64|attn_fwd_07_mma_split2_d64|attn_fwd_07_mma_split4_d64)$" \
        in out.stdout


def test_every_kernel_has_an_entry_to_profile():
    for spec in registry.select(None):
        names = profile.entry_names(spec.id, MISSION if spec.supports_head_dim(64) else MISSION._replace(D=128))
        assert all(names) and all(n in spec.path.read_text() for n in names)


def test_the_evidence_against_idle_sms_counts_elapsed_cycles():
    """A claim that SMs idle is checked by a counter averaged over elapsed cycles on every SM:
    achieved occupancy is averaged over active cycles only, so an SM without work cannot lower it."""
    import nbformat

    page = nbformat.read(Path(__file__).parents[1] / "book" / "appendix_profiling.ipynb", as_version=4)
    rows = [line for cell in page.cells if cell.cell_type == "markdown"
            for line in cell.source.splitlines() if line.startswith("|") and "SMs idle" in line]
    assert rows, "the table of claims has no row about idle SMs"
    by_short = {m.short: name for name, m in profile.METRICS.items()}
    for row in rows:
        evidence = row.strip("|").split("|")[-1]
        residency = [by_short[short] for short in by_short if short.rstrip(" %") in evidence
                     and by_short[short].startswith(("sm__warps_active", "sm__cycles_active"))]
        assert residency, f"no collected residency metric named in {evidence!r}"
        assert all(name.endswith("pct_of_peak_sustained_elapsed") for name in residency), residency
