import pytest

from attnlab.env import has_gpu


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` need a CUDA GPU; without one they are skipped, visibly, with the reason."""
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _records_judged_afresh():
    """Each test judges the records itself: a judgment kept by an earlier test (load_records keeps
    one per process) may rest on a build that test changed in place (monkeypatched flags, a
    toolchain)."""
    from attnlab.records.results import forget_judgments

    forget_judgments()


@pytest.fixture(scope="session")
def _template_repository(tmp_path_factory):
    from synthetic import build_template

    return build_template(tmp_path_factory.mktemp("template") / "repo")


@pytest.fixture
def scratch_repository(_template_repository, tmp_path, monkeypatch):
    """A git repository of its own (kernels/ and src/ at two commits, see tests/synthetic.py) that
    attnlab takes for the repository (ATTNLAB_ROOT), with an empty results/ of its own: records
    made in a test are bound to it, and the real checkout is never touched."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(_template_repository, repo, symlinks=True)
    monkeypatch.setenv("ATTNLAB_ROOT", str(repo))
    monkeypatch.setenv("ATTNLAB_RESULTS", str(repo / "results"))
    for var in ("ATTNLAB_GIT_COMMIT", "ATTNLAB_GIT_TREE", "ATTNLAB_GIT_TIME", "ATTNLAB_GIT_DIRTY"):
        monkeypatch.delenv(var, raising=False)
    return repo


@pytest.fixture
def results(scratch_repository):
    """results/ of the scratch repository: where a test's records go."""
    return scratch_repository / "results"
