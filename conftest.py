"""Defaults for `pytest --nbval book/`: run the notebooks in this Python environment (not a
kernel named in their metadata) and mask numbers with units (book/nbval_sanitize.cfg), so the
bare command and the explicit one below behave the same:

    pytest --nbval --nbval-current-env --nbval-sanitize-with book/nbval_sanitize.cfg book/

It sits at the repository root, pytest's rootdir (pyproject.toml), so that pytest loads it for any
path under the repository while book/ holds only the book's pages.
"""
from pathlib import Path

SANITIZE = Path(__file__).resolve().parent / "book" / "nbval_sanitize.cfg"


def pytest_configure(config):
    option = config.option
    if not getattr(option, "nbval_kernel_name", None) and hasattr(option, "nbval_current_env"):
        option.nbval_current_env = True
    if hasattr(option, "nbval_sanitize_with") and option.nbval_sanitize_with is None:
        option.nbval_sanitize_with = str(SANITIZE)
