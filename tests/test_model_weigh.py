"""`weigh`: a kernel edit, given as a patch of kernels/, predicted by the time model beside the
kernels as they are (attnlab.model.weigh). The edits here are made from the live chapter-1 source,
so they always apply: one that changes only a comment, one that changes the launch, one that breaks
the kernel; and patches that must be refused before anything is built."""
from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab.kernels import registry
from attnlab.model.weigh import EditFails, EditRefused, edited_copy, patched_files, weigh
from attnlab.paths import kernels_dir
from attnlab.shapes import Shape

SHAPE = Shape(1, 2, 129, 64)
GPUS = ["L4", "H100 SXM"]


def patch_of(tmp_path: Path, old: str, new: str, file: str = "01_scalar.cu", count: int = 1) -> Path:
    """A unified diff of kernels/`file` with `old` replaced by `new` (which must occur `count` times)."""
    text = (kernels_dir() / file).read_text()
    assert text.count(old) == count, f"{old!r} occurs {text.count(old)} times in {file}"
    diff = difflib.unified_diff(text.splitlines(keepends=True), text.replace(old, new).splitlines(keepends=True),
                                f"a/kernels/{file}", f"b/kernels/{file}")
    path = tmp_path / "edit.patch"
    path.write_text("".join(diff))
    return path


def test_an_edit_of_a_comment_is_weighed_equal_to_the_kernel_as_it_is(tmp_path):
    patch = patch_of(tmp_path, "running max of the scaled scores", "running maximum of the scaled scores")
    rows = weigh(patch, ["01_scalar"], [SHAPE], GPUS)
    assert [(r.kernel, r.shape, r.causal, r.gpu) for r in rows] == [
        ("01_scalar", tuple(SHAPE), c, g) for c in (False, True) for g in GPUS]
    for r in rows:
        assert r.edit == r.base and r.ratio == 1.0, r
        assert r.base.entry == "attn_fwd_01_scalar" and r.base.block == (128, 1, 1) and r.base.spill_bytes == 0


def test_the_edited_side_builds_and_launches_the_edit(tmp_path):
    """Half the rows per CTA: the edit's launch has 64-thread CTAs, three of them per head at L = 129,
    where kernels/ launches 128-thread CTAs, two per head."""
    patch = patch_of(tmp_path, "constexpr int THREADS = 128;", "constexpr int THREADS = 64;")
    rows = weigh(patch, ["01_scalar"], [SHAPE], ["L4"], causals=(True,))
    (row,) = rows
    assert (row.base.grid, row.base.block) == ((2, 2, 1), (128, 1, 1))
    assert (row.edit.grid, row.edit.block) == ((3, 2, 1), (64, 1, 1))
    assert row.edit.time_us != row.base.time_us  # the model sees the launch it was given


def test_an_edit_that_breaks_the_kernel_is_refused_not_weighed(tmp_path):
    patch = patch_of(tmp_path, "dot *= scale;", "dot *= 2.f * scale;")
    with pytest.raises(EditFails, match=r"the edited 01_scalar fails the CPU check at \(1, 2, 129, 64\)"):
        weigh(patch, ["01_scalar"], [SHAPE], ["L4"])


def test_an_edit_that_does_not_compile_is_refused_in_one_line(tmp_path):
    patch = patch_of(tmp_path, "dot *= scale;", "dot *= scale")
    with pytest.raises(EditFails, match=r"^the edited kernels do not build \(ExecutorBuildError\): .*error") as info:
        weigh(patch, ["01_scalar"], [SHAPE], ["L4"])
    assert "\n" not in str(info.value)


def test_a_patch_is_read_as_written_from_inside_a_repository_s_subdirectory(tmp_path, monkeypatch):
    """git would shift a patch's paths to the subdirectory it runs in; the patch names kernels/ all the same."""
    patch = patch_of(tmp_path, "constexpr int THREADS = 128;", "constexpr int THREADS = 64;")
    git_style = tmp_path / "git.patch"  # as `git diff` writes it
    git_style.write_text("diff --git a/kernels/01_scalar.cu b/kernels/01_scalar.cu\n" + patch.read_text())
    monkeypatch.chdir(Path(__file__).parent)  # tests/, inside the repository
    for p in (patch, git_style):
        relative = Path(os.path.relpath(p))
        assert patched_files(relative) == ["kernels/01_scalar.cu"]
        root = edited_copy(relative, tmp_path / f"copy-{p.stem}")
        assert "constexpr int THREADS = 64;" in (root / "kernels" / "01_scalar.cu").read_text()


def test_a_patch_outside_kernels_or_one_that_does_not_apply_is_refused_before_any_build(tmp_path):
    readme = tmp_path / "readme.patch"
    readme.write_text("--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# attnlab\n+# attnlab!\n")
    with pytest.raises(EditRefused, match="changes README.md, outside kernels/"):
        patched_files(readme)
    empty = tmp_path / "empty.patch"
    empty.write_text("")
    with pytest.raises(EditRefused, match="empty.patch: "):
        patched_files(empty)
    stale = patch_of(tmp_path, "constexpr int THREADS = 128;", "constexpr int THREADS = 64;")
    stale.write_text(stale.read_text().replace("constexpr int THREADS = 128;", "constexpr int THREADS = 96;"))
    with pytest.raises(EditRefused, match="does not apply to kernels/ as it is here"):
        edited_copy(stale, tmp_path / "copy")


def test_the_copy_holds_the_edit_and_every_kernel_s_sources_and_kernels_stay_as_they_are(tmp_path):
    before = (kernels_dir() / "01_scalar.cu").read_text()
    patch = patch_of(tmp_path, "constexpr int THREADS = 128;", "constexpr int THREADS = 64;")
    root = edited_copy(patch, tmp_path / "copy")
    assert "constexpr int THREADS = 64;" in (root / "kernels" / "01_scalar.cu").read_text()
    assert sorted(p.name for p in (root / "kernels").iterdir()) == sorted(p.name for p in kernels_dir().iterdir())
    assert (kernels_dir() / "01_scalar.cu").read_text() == before
    # a kernel may name files outside kernels/ among its sources (the split's and the hybrid's Python)
    for spec in registry.KERNELS.values():
        for name in (spec.source, *spec.extra_sources):
            assert (root / "kernels" / name).is_file(), (spec.id, name)


def test_the_books_edit_applies_and_turns_the_ablations_entries_at_d128_to_the_deferral(tmp_path):
    """Step 7.13's page weighs book/edits/two_rows_pv_later.patch against the kernels as they are: it
    must still apply, and change what the page says it changes: the last switch (DEFER_PV) of the
    two-row entries at D = 128 of 07_mma_two_rows_at_d128 and of no other entry, and a negative
    scale's flip of Q out of the loop (in each fragment read there before, in the Q tile after)."""
    from attnlab.paths import repo_root

    edit = repo_root() / "book" / "edits" / "two_rows_pv_later.patch"
    assert patched_files(edit) == ["kernels/07_mma_swizzle.cu"]
    root = edited_copy(edit, tmp_path / "copy")
    before = (kernels_dir() / "07_mma_swizzle.cu").read_text()
    after = (root / "kernels" / "07_mma_swizzle.cu").read_text()

    def entries(text):
        return {line for line in text.splitlines() if line.startswith("ATTN07_ENTRY(")}

    two_rows = {"attn_fwd_07_mma_q_from_tile_d128", "attn_fwd_07_mma_q_from_tile_split2_d128"}
    assert two_rows <= set(registry.get("07_mma_two_rows_at_d128", "sm_90").entries_at_head_dim(128))
    gone, came = entries(before) - entries(after), entries(after) - entries(before)
    assert {line.split("(", 1)[1].split(",", 1)[0] for line in gone | came} == two_rows
    assert {line[:-len("false)")] + "true)" for line in gone if line.endswith("false, false)")} == came
    flip = "for (int r = 0; r < 4; ++r) qf[mb][r] ^= 0x80008000u;"
    assert flip in before and flip not in after and "chunk->x ^= 0x80008000u;" in after


def cli(*args):
    return subprocess.run([sys.executable, "-m", "attnlab", "weigh", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("args, says", [
    (["missing.patch", "01_scalar"], "attnlab weigh: missing.patch: no such patch file"),
    (["{patch}", "01_scalr"], "attnlab weigh: unknown kernel '01_scalr'; did you mean '01_scalar'?"),
    (["{patch}", "01_scalar", "--gpu", "H100SXM"], "attnlab weigh: unknown GPU 'H100SXM'; did you mean 'H100 SXM'?"),
    (["{patch}", "01_scalar", "--shape", "1", "2", "129", "512"], "attnlab weigh: --shape 1 2 129 512: "),
    (["{readme}", "01_scalar"], "outside kernels/ (only kernel sources are weighed)"),
])
def test_the_command_refuses_bad_input_in_one_line(tmp_path, args, says):
    patch = patch_of(tmp_path, "constexpr int THREADS = 128;", "constexpr int THREADS = 64;")
    readme = tmp_path / "readme.patch"
    readme.write_text("--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# attnlab\n+# attnlab!\n")
    out = cli(*[a.format(patch=patch, readme=readme) for a in args])
    assert out.returncode == 2 and out.stdout == "", out
    assert len(out.stderr.strip().splitlines()) == 1 and says in out.stderr, out.stderr


def test_the_command_prints_both_sides_and_says_they_are_predictions(tmp_path):
    patch = patch_of(tmp_path, "running max of the scaled scores", "running maximum of the scaled scores")
    out = cli(str(patch), "01_scalar", "--gpu", "L4", "--shape", "1", "2", "129", "64")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:6] == ["kernel", "shape", "causal", "GPU", "predicted", "us"]
    assert [line.split()[0] for line in lines[1:3]] == ["01_scalar", "01_scalar"] and "1.000" in lines[1]
    assert "not measurements" in lines[-1] and "passed the CPU check" in lines[-1]
