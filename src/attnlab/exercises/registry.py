"""The exercises, named once: each one's id, chapter, title, hint and checker (attnlab.exercises.checkers),
its skeleton exercises/<id>.cu and solution exercises/solutions/<id>.cu, and `check`, which judges a
reader's file and answers in one line.

    from attnlab.exercises.registry import EXERCISES, check
    verdict = check("ch03-warp-reduce", "exercises/ch03-warp-reduce.cu")
    print(verdict.line())          # "ch03-warp-reduce: passes ..." or what is wrong, and where
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..paths import repo_root
from . import checkers
from .harness import Fail


def exercises_dir() -> Path:
    return repo_root() / "exercises"


@dataclass(frozen=True)
class Exercise:
    id: str            # chNN-short-name: the skeleton is exercises/<id>.cu
    chapter: int
    title: str         # what the reader writes, in a few words
    hint: str          # printed when the check fails
    checker: Callable[[Path], str]  # raises Fail; returns the pass line's detail

    @property
    def skeleton(self) -> Path:
        return exercises_dir() / f"{self.id}.cu"

    @property
    def solution(self) -> Path:
        return exercises_dir() / "solutions" / f"{self.id}.cu"


@dataclass(frozen=True)
class Verdict:
    exercise: str
    passed: bool
    message: str       # one line
    hint: str = ""     # the exercise's hint, on failure

    def line(self) -> str:
        return f"{self.exercise}: {self.message}"

    def to_dict(self) -> dict:
        return {"exercise": self.exercise, "passed": self.passed, "message": self.message, "hint": self.hint}

    def __str__(self) -> str:
        """The line, and the hint on its own line when it fails (as `exercises check` prints them)."""
        return self.line() + (f"\nhint: {self.hint}" if not self.passed and self.hint else "")

    def _repr_pretty_(self, p, cycle) -> None:  # IPython and Jupyter show a verdict as its text
        p.text(str(self))


# One per gap, two or three per chapter, in the book's order.
REGISTRY: tuple[Exercise, ...] = (
    Exercise("ch01-online-softmax", 1, "rescale the running (m, l, acc) when a chunk raises the max",
             "Every term of l and acc was weighted against the max of its time. When the max grows from m to "
             "m_new, which factor turns exp(s - m) into exp(s - m_new)? Apply it to l and to each acc[d] "
             "before the chunk's terms join them. (Without it the kernel is right only while the first chunk "
             "holds the row's max.)",
             checkers.ch01),
    Exercise("ch01-causal-limit", 1, "the number of keys a row sees: causal, non-causal, past L",
             "Three threads to think of: one without the mask (all L keys), one with it (row i sees keys "
             "0..i, the diagonal too), and one whose row is past L: it exists in the last block. What may "
             "that one read?",
             checkers.ch01),
    Exercise("ch02-tile-barriers", 2, "the __syncthreads that make a reused shared tile safe",
             "Follow one element of k_s through two tiles: who writes it, who reads it, who overwrites it. "
             "Every hand-off between two threads needs a barrier between the two accesses; there are two "
             "hand-offs per tile (read after write, write after read). A race report names the two lines "
             "with no barrier between them; its label is the order this run happened to take, so go by the "
             "lines.",
             checkers.ch02_barriers),
    Exercise("ch02-pad-q-tile", 2, "pad the transposed Q tile so its stores hit 32 banks",
             "Work out the bank of each lane's store: word (d * Q_STRIDE + r) / 2, bank word % 32. An element "
             "is half a bank: a stride of an odd number of halves puts two lanes in one word's bank; count "
             "the stride in words instead.",
             checkers.ch02_pad),
    Exercise("ch03-warp-reduce", 3, "group_sum / group_max: butterfly reductions over groups of `width` lanes",
             "A butterfly: at each step every lane combines its value with the lane whose index differs in "
             "one bit (__shfl_xor_sync). Which bits may differ inside an aligned group of `width` lanes? "
             "Every lane must call every shuffle (no `if` around it).",
             checkers.ch03_reduce),
    Exercise("ch03-row-groups", 3, "map lanes to (row, slice of D): G lanes per row, spare lanes",
             "Lanes 0..G-1 are the warp's first row, lanes G..2G-1 its second, and so on: a lane's place in "
             "its group and its group's number both come from threadIdx.x and G, and a block holds THREADS / "
             "G rows. A lane whose slice starts at or past D owns nothing.",
             checkers.ch03_rows),
    Exercise("ch04-row-tail", 4, "load8's 2-byte path: mask the columns past the diagonal and past L",
             "Two bounds meet in the last step of a row: the columns the row sees (n: row + 1 under the "
             "causal mask) and the end of the row. An unseen element must come out as -inf, and must not be "
             "read at all.",
             checkers.ch04),
    Exercise("ch04-merge-lanes", 4, "merge the 32 lanes' online (max, sum) into the row's",
             "Each lane's l sums exp(x - m) for its own m. Before 32 sums can be added they need one "
             "reference, the row's max: how do you move a lane's l from its m to row_max? (A lane that saw no "
             "column has m = -inf and l = 0.)",
             checkers.ch04),
    Exercise("ch05-score-tile", 5, "S = Q K^T with wmma: fragment layouts and leading dimensions",
             "K^T's column j is K's row j: a matrix_b fragment of K^T loads straight from K's rows in the "
             "layout whose columns are contiguous in memory. The leading dimension is the distance between "
             "those rows in shared memory, padding included. Start each 16-key block's accumulator at 0 and "
             "store it row-major.",
             checkers.ch05),
    Exercise("ch05-pv", 5, "O += P V with wmma: an accumulator loaded from and stored to shared memory",
             "O_w already holds the earlier tiles' sum (rescaled): start each accumulator from it, not from "
             "zero, and store it back where it came from, in the same layout. P is the A operand (16 rows x "
             "BN keys); V is the B operand as stored (keys x D, row-major).",
             checkers.ch05),
    Exercise("ch06-ring-barriers", 6, "the producer/consumer hand-off: bar.sync and bar.arrive, ids and counts",
             "For each barrier ask: who must wait for it (bar_sync), and who only announces (bar_arrive)? A "
             "phase completes when its count has arrived, waiters and announcers together: who takes part in "
             "each phase?",
             checkers.ch06),
    Exercise("ch06-cp-async-tile", 6, "the producer's cp.async copy of a K/V tile, zero-filled past L",
             "Number the stage's chunks so that consecutive threads take consecutive 16-byte chunks of a row, "
             "K's chunks first, then V's. A row at or past L must be read not at all (src_bytes 0) and still "
             "land as zeros, from a source address inside the tensor.",
             checkers.ch06),
    Exercise("ch07-swizzle", 7, "the XOR swizzle of a tile: conflict-free ldmatrix and cp.async",
             "Only the chunk's position inside its row may change, and the positions must stay a permutation "
             "of the row's. Take the same chunk of 8 consecutive rows: their positions must differ in the "
             "three bits that pick the bank group. XOR with a per-row number permutes.",
             checkers.ch07_swizzle),
    Exercise("ch07-ldmatrix-lanes", 7, "ldmatrix.x4 lane -> (row, chunk) maps for mma.sync's A and B fragments",
             "Lanes 8i..8i+7 give the 8 row addresses of matrix i, and matrix i becomes register i of every "
             "lane. Write down which block (rows 0-7 or 8-15, chunk 0 or 1) each register must be in each "
             "order, then invert it: lane -> (row, chunk).",
             checkers.ch07_lanes),
    Exercise("ch07-wait-depth", 7, "the cp.async.wait_group depth of a one-barrier ring of STAGES buffers",
             "Count, for one thread, the groups it has committed when it reaches the wait of iteration j: the "
             "prologue's, then one per iteration, empty ones too. Which one holds tile j? Everything newer "
             "may stay in flight.",
             checkers.ch07_wait),
)

EXERCISES: dict[str, Exercise] = {e.id: e for e in REGISTRY}


def get(exercise_id: str) -> Exercise:
    try:
        return EXERCISES[exercise_id]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(str(exercise_id), list(EXERCISES), n=1)
        guess = f"; did you mean {close[0]!r}?" if close else " (`python -m attnlab exercises` lists them)"
        raise KeyError(f"unknown exercise {exercise_id!r}{guess}") from None


def check(exercise_id: str, path, isolate: bool = False, timeout: float = 300.0) -> Verdict:
    """Judge the reader's file for one exercise. `isolate`: run the kernel in a child process, so that
    a kernel that crashes the executor (a wild pointer, a division by zero) or loops forever
    between two barriers comes back as a failed verdict instead of taking this process with it."""
    ex = get(exercise_id)
    path = Path(path)
    if isolate:
        return _check_in_child(ex, path, timeout)
    try:
        detail = ex.checker(path)
    except Fail as exc:
        message = str(exc)
        return Verdict(ex.id, False, message, "" if message.startswith("does not compile") else ex.hint)
    return Verdict(ex.id, True, detail)


def _check_in_child(ex: Exercise, path: Path, timeout: float) -> Verdict:
    cmd = [sys.executable, "-m", "attnlab.exercises", ex.id, str(Path(path).absolute())]
    # the child imports this very attnlab, whatever put it on this process's path (a notebook's
    # sys.path.insert, PYTHONPATH)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).absolute().parents[2]),
                                                    env.get("PYTHONPATH", "")) if p)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired:
        return Verdict(ex.id, False, f"no verdict after {timeout:.0f} s: the checker did not finish (each launch "
                                     "stops at 60 s: many slow launches?)", ex.hint)
    if proc.returncode < 0:
        import signal

        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        what = {"SIGSEGV": "an access far outside every buffer (a wild pointer or index)",
                "SIGFPE": "an integer division by zero", "SIGBUS": "a misaligned or wild access",
                "SIGILL": "a trap (an exited fiber resumed?)"}.get(name, "")
        return Verdict(ex.id, False, f"the kernel crashed the executor ({name}{': ' + what if what else ''})", ex.hint)
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return Verdict(ex.id, False, f"the checker failed: {_exception_line(proc.stderr)}", ex.hint)
    return Verdict(data["exercise"], data["passed"], data["message"], data["hint"])


def _exception_line(stderr: str) -> str:
    """A child's traceback said in one line: its exception's first line (not the tail of a long
    message, such as a compiler's log), or stderr's last line."""
    lines = stderr.strip().splitlines() or ["no output"]
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if frames:
        for line in lines[frames[-1] + 1:]:
            if line and not line[0].isspace():
                return line.strip()
    return lines[-1].strip()
