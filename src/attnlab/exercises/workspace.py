"""The reader's side of the exercises, for a notebook as much as a script: `start` copies an
exercise's skeleton to the reader's working copy (my-exercises/<id>.cu at the repository root,
git-ignored, never overwritten) and says where it is and how to check it; `check` judges a file
in a child process, so that a kernel that crashes or hangs the executor cannot take the notebook's
kernel with it, and answers with the verdict (shown as its one line, and the hint on failure).

    import attnlab.exercises as ex
    ex.start("ch03-warp-reduce")   # my-exercises/ch03-warp-reduce.cu, and the line that checks it
    ex.check("ch03-warp-reduce")   # that copy judged: "ch03-warp-reduce: passes ..." or what is wrong

Relative paths are the reader's: they resolve against the current directory (a chapter notebook's
is book/), and a missing file is one line naming where the skeleton is from there.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..paths import repo_root
from .registry import Verdict, get


def my_exercises_dir() -> Path:
    """Where `start` puts the reader's working copies (git-ignored)."""
    return repo_root() / "my-exercises"


def working_copy(exercise_id: str) -> Path:
    """The reader's working copy of one exercise (it need not exist yet)."""
    return my_exercises_dir() / f"{get(exercise_id).id}.cu"


def shown(path: Path) -> str:
    """A path as the reader would type it from the current directory: relative when that stays near
    (at most one level up), absolute otherwise."""
    path = Path(path).absolute()
    try:
        rel = os.path.relpath(path, Path.cwd())
    except ValueError:  # another drive (Windows)
        return str(path)
    return str(path) if rel.startswith(os.path.join("..", "..")) else rel


def resolved(given) -> Path:
    """A path the reader gave, absolute: relative ones are the current directory's."""
    path = Path(given).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def missing_file_line(exercise_id: str, given) -> str | None:
    """None when `given` is a file; else the one line that says what is missing, where it was looked
    for, and where the skeleton is (from the current directory)."""
    path = Path(given).expanduser()
    full = resolved(given)
    if full.is_file():
        return None
    ex = get(exercise_id)
    where = "" if path.is_absolute() else f" in {Path.cwd()}"
    what = f"{str(given)!r} is a directory, not a .cu file" if full.is_dir() else f"no file {str(given)!r}{where}"
    return f"{what} (the skeleton of {ex.id} is {shown(ex.skeleton)})"


def start(exercise_id: str) -> None:
    """Copy the exercise's skeleton to the working copy (an existing copy is kept as it is), print
    its path and how to check it; in a notebook, also a link that opens it in JupyterLab's editor."""
    ex = get(exercise_id)
    copy = working_copy(ex.id)
    if copy.exists():
        state = "kept as you left it (delete it for a fresh start)"
    else:
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ex.skeleton, copy)
        state = f"new, a copy of {shown(ex.skeleton)}"
    print(f"{ex.id}: {ex.title}")
    print(f"your copy: {copy} ({state})")
    print("fill the gap between '// ---- TODO(exercise)' and '// ---- end of exercise', then check it:")
    print(f'    attnlab.exercises.check("{ex.id}")')
    _link_in_notebook(copy)


def _link_in_notebook(path: Path) -> None:
    """A markdown link to `path`, relative to the notebook's directory (the kernel's cwd), which
    JupyterLab opens in its editor; nothing outside a notebook."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return
    try:
        rel = Path(os.path.relpath(path, Path.cwd())).as_posix()
    except ValueError:
        return
    display(Markdown(f"Open [{path.name}]({rel.replace(' ', '%20')}) in the editor."))


def check(exercise_id: str, path=None, timeout: float = 300.0) -> Verdict:
    """Judge the reader's file (default: the working copy `start` made) on the CPU executor, in a
    child process. The verdict shows as its one line (and `hint: ...` when it fails); `.passed`,
    `.message` and `.hint` are its parts. A missing file or a missing C++ compiler is a failed
    verdict with one line that says so, not an exception."""
    from .registry import check as judge

    ex = get(exercise_id)
    if path is None:
        copy = working_copy(ex.id)
        if not copy.is_file():
            return Verdict(ex.id, False, f"no working copy yet ({copy}): attnlab.exercises.start(\"{ex.id}\") "
                                         f"makes one from the skeleton")
        path = copy
    missing = missing_file_line(ex.id, path)
    if missing:
        return Verdict(ex.id, False, missing)
    from ..executor.build import compiler

    try:
        compiler()  # no C++ compiler: say what to install, not a failed kernel
    except Exception as exc:  # noqa: BLE001  (ExecutorUnavailable)
        return Verdict(ex.id, False, f"cannot check: {exc}")
    return judge(ex.id, resolved(path), isolate=True, timeout=timeout)
