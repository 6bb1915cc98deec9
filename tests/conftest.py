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
