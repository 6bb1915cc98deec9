"""The mutation check in CI: every plausible mistake listed in attnlab.executor.mutants, planted in a
scratch copy of kernels/, makes the CPU suite fail. A survivor fails this file."""
from __future__ import annotations

import pytest

from attnlab.executor import mutation
from attnlab.executor.mutants import MUTANTS, Mutant

IDS = [m.id for m in MUTANTS]


def test_every_mutant_applies_to_the_kernels_as_they_are():
    assert len(IDS) == len(set(IDS)), "mutant ids repeat"
    bad = [p for m in MUTANTS for p in mutation.problems(m)]
    assert not bad, "\n".join(bad)


def test_the_list_covers_each_kind_of_mistake():
    """At least 12, among them each kind a reviewer plants: bounds and causal limits, a removed or
    weakened barrier, a wrong barrier count, a wrong wait_group depth, a missing .trans, a swapped
    fragment, a wrong swizzle and lane map, a wrong shuffle offset and mask."""
    assert len(MUTANTS) >= 12
    needed = ["causal-limit", "row-bound", "tile-tail", "no-reuse-barrier", "warp-barrier", "barrier-count",
              "wait-depth", "missing-trans", "swapped-fragment", "swizzle", "lane-map", "shuffle", "quad-mask"]
    missing = [n for n in needed if not any(n in i for i in IDS)]
    assert not missing, f"no mutant of kind {missing}"
    files = {m.file for m in MUTANTS}
    assert {"01_scalar.cu", "02_block_tiling.cu", "03_warp_reductions.cu", "wmma_tile.cuh", "07_mma_swizzle.cu",
            "swizzle.cuh", "common.cuh", "06_warp_specialized.cu"} <= files


def test_a_harmless_edit_survives_and_a_missing_text_is_invalid():
    """The runner can say "survived": an edit of a comment passes every case it runs."""
    comment = Mutant("comment", "01_scalar.cu", "// running max of the scaled scores",
                     "// the running max", ("01_scalar",), "not a mistake")
    outcome = mutation.run_in_process(comment, max_cases=2)
    assert outcome.status == "survived" and outcome.cases_run == 2 and not outcome.ok
    ghost = Mutant("ghost", "01_scalar.cu", "text that is not there", "x", ("01_scalar",), "stale")
    assert mutation.run_in_process(ghost).status == "invalid"


def test_a_child_that_fails_before_its_cases_is_an_error_not_a_kill():
    unknown = Mutant("no-such-mutant", "01_scalar.cu", "x", "y", ("01_scalar",), "not in the list")
    outcome = mutation.run_isolated(unknown, timeout=120)
    assert outcome.status == "error" and not outcome.ok


@pytest.fixture(scope="module")
def outcomes():
    return {o.mutant: o for o in mutation.run_all(MUTANTS, progress=False)}


@pytest.mark.parametrize("mutant_id", IDS)
def test_mutant_is_caught_by_the_cpu_suite(outcomes, mutant_id):
    o = outcomes[mutant_id]
    assert o.ok, f"{mutant_id} ({mutation.get(mutant_id).why}) was not caught: {o.status}: {o.by}"
