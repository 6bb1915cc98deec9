"""What travels to a GPU machine (attnlab.session: carry, prebuild): the bound that holds the carry
to its budget, computed from the registry and the search space alone, and the bound shown on real
builds; the archive packed and unpacked; a stage that builds what it needs and does not find."""
from __future__ import annotations

import io
import lzma
import tarfile

import pytest

from attnlab.session import carry, prebuild, stages
from attnlab.kernels import registry, spec
from attnlab.gpu import search
from attnlab.kernels.compile import KernelBuildError


def test_the_carry_to_an_h100_fits_its_budget_by_the_bound():
    """Fails as soon as a change to kernels, knobs or stages would make the staged GPU run carry
    more than BUDGET_MIB: nothing built, nothing downloaded."""
    bound = carry.estimate("sm_90")
    assert bound.cubins == len(prebuild.registered("sm_90")) and bound.reports == len(prebuild.static_reports())
    assert bound.wheels == carry.WHEELS_MAX_MIB * carry.MiB
    assert bound.total <= carry.BUDGET_MIB * carry.MiB, bound.text()
    assert carry.BUDGET_MIB < carry.LIMIT_MIB


def test_the_carry_holds_one_file_per_build_and_no_searched_cubin():
    builds = prebuild.carried("sm_90")
    files = [p for b in builds for p in b.files()]
    assert len(files) == len(set(files)), "two builds leave one file: it would be counted twice"
    # chapter 7's ablations launch entries of 07_mma's cubin: one build for all of them
    mma = [b for b in builds if b.cubin and b.spec.source == registry.get("07_mma").source]
    assert len(mma) < len([s for s in registry.select(None) if s.source == registry.get("07_mma").source])
    # the searched configurations are built on the GPU machine, by the extras stage
    searched = {b.identity for b in prebuild.searched("sm_90")}
    assert len(searched) == len(search.valid_space("07_mma", 64, "sm_90"))
    assert searched & {b.identity for b in builds} <= {b.identity for b in prebuild.registered("sm_90")}
    assert set(stages.STAGE_BUILDS) == {s.name for s in stages.STAGES}
    assert "searched" in stages.STAGE_BUILDS["extras"]


@pytest.fixture(scope="module")
def registered_builds():
    """The registered kernels' sm_90 builds, in attnlab's cache (the static tests build them too)."""
    builds = prebuild.registered("sm_90")
    _, failures, _ = prebuild.build_missing(builds, progress=False)
    assert not failures, failures
    return builds


def test_the_bound_holds_on_the_real_builds_and_the_archive_round_trips(registered_builds, tmp_path):
    """Every carried cubin compresses alone under its chapter's bound, and the solid archive weighs
    less than the sum of its files' bounds (pack refuses otherwise): the estimate is an upper bound."""
    for b in registered_builds:
        cubin, report = b.files()
        assert carry.cubin_bound(b) == (carry.CUBIN_XZ_MAX if b.spec.chapter >= 7 else carry.CUBIN_XZ_MAX_EARLY)
        assert carry.xz_alone(cubin.read_bytes()) <= carry.cubin_bound(b), cubin.name
        assert report.stat().st_size <= carry.REPORT_MAX, report.name
    archive, n_files = carry.pack(registered_builds, tmp_path / "carry", "sm_90")
    assert n_files == 2 * len(registered_builds)
    assert archive.stat().st_size <= carry.archive_bound(registered_builds)
    # unpacked into an empty cache: the same files, byte for byte, and the nvcc that built them
    manifest = carry.unpack(archive, tmp_path / "cache")
    for b in registered_builds:
        for path in b.files():
            assert (tmp_path / "cache" / "cubin" / path.name).read_bytes() == path.read_bytes()
    from attnlab.kernels.toolchain import nvcc_version
    assert manifest["nvcc"] == nvcc_version() and len(manifest["files"]) == n_files


@pytest.mark.parametrize("bound", ["CUBIN_XZ_MAX", "CUBIN_XZ_MAX_EARLY"])
def test_pack_refuses_a_cubin_over_its_bound(registered_builds, tmp_path, monkeypatch, bound):
    monkeypatch.setattr(carry, bound, 1024)
    with pytest.raises(ValueError, match=f"over {bound} "):
        carry.pack(registered_builds, tmp_path, "sm_90")
    assert not list(tmp_path.glob("*.tar.xz"))


def _archive(tmp_path, names):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    path = tmp_path / "prebuilt-sm_90.tar.xz"
    path.write_bytes(lzma.compress(raw.getvalue()))
    return path


@pytest.mark.parametrize("name", ["../outside.cubin", "cubin/../../x", "/etc/x", "cubin/sub/x.cubin"])
def test_unpack_refuses_what_is_not_a_plain_cache_file(tmp_path, name):
    archive = _archive(tmp_path, [carry.MANIFEST, name])
    with pytest.raises(ValueError, match="refused entry"):
        carry.unpack(archive, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() and not (tmp_path.parent / "outside.cubin").exists()


def _small_stage(monkeypatch, tmp_path, kernel="04_cublas_hybrid"):
    """The check stage reduced to one small kernel's sm_90 build, in an empty cache."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(stages.STAGE_NEEDS, "check", (("attnlab",), ()))
    small = [prebuild.Build(registry.get(kernel, "sm_90"), "sm_90")]
    monkeypatch.setitem(prebuild.SETS, "registered", lambda arch: small)
    return small


def test_a_stage_builds_what_it_needs_and_does_not_find(tmp_path, monkeypatch):
    monkeypatch.setattr(carry, "carried_archives", lambda root=None: [])
    (build,) = _small_stage(monkeypatch, tmp_path)
    problems, notes = stages.prepare("check", arch="sm_90")
    assert problems == [] and build.done()
    assert any("0 of 1 builds (sm_90) found" in n and "1 built here" in n for n in notes), notes


def test_a_stage_unpacks_the_carry_and_builds_nothing_it_holds(registered_builds, tmp_path, monkeypatch):
    b = next(b for b in registered_builds if b.spec.id == "04_cublas_hybrid")
    archive, _ = carry.pack([b], tmp_path / "carried", "sm_90")  # from the shared cache, before the switch
    monkeypatch.setattr(carry, "carried_archives", lambda root=None: [archive])
    _small_stage(monkeypatch, tmp_path)
    problems, notes = stages.prepare("check", arch="sm_90")
    assert problems == [], problems
    assert any(n.startswith("unpacked prebuilt-sm_90.tar.xz: 2 files") for n in notes), notes
    assert any("1 of 1 builds (sm_90) found" in n and "0 built here" in n for n in notes), notes


def test_a_build_nvcc_refuses_is_the_stages_problem(tmp_path, monkeypatch):
    monkeypatch.setattr(carry, "carried_archives", lambda root=None: [])
    (build,) = _small_stage(monkeypatch, tmp_path)

    def refuse(self):
        raise KernelBuildError("nvcc failed for 04_cublas_hybrid (sm_90):\nerror: planted")
    monkeypatch.setattr(prebuild.Build, "run", refuse)
    problems, _ = stages.prepare("check", arch="sm_90")
    assert problems == ["nvcc refused 04_cublas_hybrid sm_90: nvcc failed for 04_cublas_hybrid (sm_90):"]


def test_a_damaged_carry_is_built_instead(tmp_path, monkeypatch):
    damaged = tmp_path / "prebuilt-sm_90.tar.xz"
    damaged.write_bytes(b"not xz")
    monkeypatch.setattr(carry, "carried_archives", lambda root=None: [damaged])
    (build,) = _small_stage(monkeypatch, tmp_path)
    problems, notes = stages.prepare("check", arch="sm_90")
    assert problems == [] and build.done()
    assert any("not unpacked" in n and "made here" in n for n in notes), notes


def test_a_searched_configuration_nvcc_refuses_is_a_verdict_not_a_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(carry, "carried_archives", lambda root=None: [])
    _small_stage(monkeypatch, tmp_path)
    config = search.default_config("07_mma", 64, "sm_90")
    searched = [prebuild.Build(registry.get("07_mma", "sm_90").with_config(config), "sm_90", required=False)]
    monkeypatch.setitem(prebuild.SETS, "registered", lambda arch: searched)

    def refuse(self):
        raise KernelBuildError("nvcc failed for 07_mma (sm_90):\nerror: planted")
    monkeypatch.setattr(prebuild.Build, "run", refuse)
    problems, notes = stages.prepare("check", arch="sm_90")
    assert problems == [] and any("the static gate's verdict" in n for n in notes), notes


def test_the_sets_follow_their_target_not_the_gpu_at_hand(monkeypatch):
    """prepare on an H100 builds what gpu_prepare.sh counted on a machine without a GPU: the L4's
    static spaces by the L4's limits, the searched space by sm_90's."""
    import attnlab.gpus

    here = (len(prebuild.static_reports()), len(prebuild.searched("sm_90")))
    monkeypatch.setattr(attnlab.gpus, "arch_at_hand", lambda: ("sm_90", "an H100's"))
    monkeypatch.setattr(attnlab.gpus, "_of_gpu_at_hand", lambda *args: (227 * 1024, "an H100's"))
    monkeypatch.setattr(spec, "_BY_ARCH", {})  # the kernels built per architecture: none yet
    assert (len(prebuild.static_reports()), len(prebuild.searched("sm_90"))) == here
