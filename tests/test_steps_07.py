"""Chapter 7's climb: each step one template switch away from the one before (step 7.11 two, the
lean loop's, which step 7.12 takes apart), its code as the compiler sees it, and a diff a reader can
take in (attnlab.kernels.steps)."""
from __future__ import annotations

import re

import pytest

from attnlab.kernels import steps
from attnlab.kernels.registry import KERNELS, STEPS_07


def test_the_steps_climb_to_the_chapters_kernel_and_past_it():
    assert [s.number for s in STEPS_07] == [f"7.{i}" for i in range(1, len(STEPS_07) + 1)]
    ids = [s.kernel_id for s in STEPS_07]
    assert "07_mma" in ids
    for kid in ids[ids.index("07_mma") + 1:]:  # the steps past the chapter's kernel are its variants
        assert KERNELS[kid].variant_of == "07_mma"
    for s in STEPS_07:
        assert KERNELS[s.kernel_id].chapter == 7
    assert len({s.kernel_id for s in STEPS_07}) == len(STEPS_07)


KERNEL_STEPS = [s for s in STEPS_07[1:] if s.rule is None]
# Step 7.11 turned on the lean loop's two switches at once; step 7.12 turns one of them off again.
TWO_SWITCHES = {"7.11": ["WHOLE_TILES", "SKIP_RESCALE"]}


def changed_switches(step) -> list[str]:
    """The switches a step turns, at the head dim whose code stands for it (steps.shown_head_dim)."""
    D = steps.shown_head_dim(step)
    before, after = steps.step_switches(steps.previous(step), D), steps.step_switches(step, D)
    return [name for name in steps.SWITCHES if before[name] != after[name]]


@pytest.mark.parametrize("step", KERNEL_STEPS, ids=lambda s: s.number)
def test_each_step_sets_exactly_one_switch_more_than_the_step_before(step):
    changed = changed_switches(step)
    assert len(changed) == 1 or changed == TWO_SWITCHES.get(step.number), f"{step.number} changes {changed}"


@pytest.mark.parametrize("step", [s for s in STEPS_07 if s.rule is not None], ids=lambda s: s.number)
def test_a_launcher_step_keeps_the_kernel_and_shows_its_rule(step):
    """Steps 7.9 and 7.10 change which launch runs a shape, not the kernel: each launches the step
    before's kernel (or what the step before launches) or an earlier step's, shows the step before's
    code, and its page shows the rule's Python in place of a kernel diff."""
    from attnlab.book import climb

    before = steps.previous(step)
    earlier = [s.kernel_id for s in STEPS_07[:STEPS_07.index(step)]]
    alternatives = KERNELS[step.kernel_id].alternatives
    assert set(KERNELS[before.kernel_id].alternatives or (before.kernel_id,)) <= set(alternatives)
    assert set(alternatives) <= set(earlier), "it launches earlier steps only"
    assert steps.step_switches(before) == steps.step_switches(step) and steps.shown_head_dim(step) == 64
    assert steps.step_diff(before, step) == ""
    block = climb.diff_block(step.number)
    assert "```python\ndef " in block and steps.rule_source(step) in block and "```diff" not in block


def test_the_first_step_has_every_technique_off_and_the_last_every_one_on_but_the_vote():
    """Step 7.11's vote went again in step 7.12: it cost the rescale more waits than it saved. Step
    7.13 defers O += P V where each warp takes one row block: at D = 64 its two row blocks keep
    step 7.12's loop, and its code stands at D = 128."""
    first, last = steps.step_switches(STEPS_07[0]), steps.step_switches(STEPS_07[-1], 64)
    assert first == {"SWIZZLE": False, "STAGES": 1, "ONE_BARRIER": False, "LONGEST_FIRST": False, "KV_SPLIT": 1,
                     "ROW_BLOCKS": 1, "ACROSS_HEADS": False, "WHOLE_TILES": False, "SKIP_RESCALE": False,
                     "DEFER_PV": False}
    assert last["SWIZZLE"] and last["STAGES"] >= 2 and last["ONE_BARRIER"] and last["LONGEST_FIRST"]
    assert last["KV_SPLIT"] > 1 and last["ROW_BLOCKS"] == 2 and last["ACROSS_HEADS"] and last["WHOLE_TILES"]
    assert not last["SKIP_RESCALE"] and steps.step_switches("7.11")["SKIP_RESCALE"]
    assert not last["DEFER_PV"] and steps.shown_head_dim(STEPS_07[-1]) == 128
    assert steps.step_switches(STEPS_07[-1]) == {**last, "ROW_BLOCKS": 1, "DEFER_PV": True}


@pytest.mark.parametrize("step", KERNEL_STEPS, ids=lambda s: s.number)
def test_each_diff_is_short_and_shows_the_switch_it_turns(step):
    diff = steps.step_diff(steps.previous(step), step)
    # Step 7.13 moves O += P V a trip later (its P and V stage held over, P in fp32 where registers
    # allow, V's copy a tile behind K's, and the last tile's after the loop): about 100 lines; the
    # others stay under 60.
    assert 0 < steps.changed_lines(diff) < (110 if step.number == "7.13" else 60), diff
    after = steps.step_switches(step)
    for name in changed_switches(step):
        assert f"+// {name} = {str(after[name]).lower()}" in diff


@pytest.mark.parametrize("step", STEPS_07, ids=lambda s: s.number)
def test_a_steps_code_holds_no_branch_its_switches_decide(step):
    code = steps.step_source(step)
    switch = "|".join(steps.SWITCHES + tuple(steps.FIXED) + tuple(steps.DERIVED))
    left = re.findall(rf"if constexpr \([^)]*\b(?:{switch})\b", code)
    assert not left, left
    assert not re.search(rf"\((?:{switch}) \?", code)
    body = code.split("int L, float scale, int causal) {", 1)[1]
    assert "o_part +" not in body and "ml[" not in body, \
        "the partial route (07_mma_split_ctas) is not a step: its code goes"


def test_the_code_changes_where_the_technique_lives():
    assert "(chunk ^ (row & 7))" in steps.step_source("7.3")
    assert "(chunk ^ (row & 7))" not in steps.step_source("7.2")
    assert "gridDim.x - 1 - q_block" in steps.step_source("7.2")
    assert "gridDim.x - 1 - q_block" not in steps.step_source("7.1")
    assert "cp_async_wait<0>" in steps.step_source("7.3") and "cp_async_wait<0>" not in steps.step_source("7.4")
    assert "cp_async_wait<STAGES - 2>" in steps.step_source("7.5")
    assert "slot(other" in steps.step_source("7.6") and "slot(other" not in steps.step_source("7.5")
    assert "// ROW_BLOCKS = 2" in steps.step_source("7.7") and "// ROW_BLOCKS = 1" in steps.step_source("7.6")
    assert "q_block = linear / gridDim.y;" in steps.step_source("7.8")
    assert "q_block = linear / gridDim.y;" not in steps.step_source("7.7")
    for marks in ("load_whole_tile", "__any_sync"):  # and the helper it brings shows with it
        assert marks in steps.step_source("7.11") and marks not in steps.step_source("7.10")
    assert "load_whole_tile" in steps.step_source("7.12") and "__any_sync" not in steps.step_source("7.12")
    for marks in ("add_pv_prev(prev_stage);", "float p_prev[", "v_stage = (stage + STAGES - 2) % STAGES"):
        assert marks in steps.step_source("7.13") and marks not in steps.step_source("7.12", 128)
    assert "if (true) {" in steps.step_source("7.13") and "if (DEFER_PV ||" not in steps.step_source("7.12")
    # no step reads Q from its tile (two row blocks at D = 128 do: the ablation 07_mma_two_rows_at_d128)
    assert all("q_lane" not in steps.step_source(s.number, D) and "q_frag[ROW_BLOCKS][K_STEPS][4]" in
               steps.step_source(s.number, D) for s in STEPS_07 for D in (64, 128))


def test_specialize_takes_the_branch_the_switches_choose():
    text = ("void f() {\n"
            "    if constexpr (A == 1) {\n        one();\n    } else if constexpr (B) {\n        two();\n"
            "    } else {\n        three();\n    }\n"
            "    // said of the next line only\n"
            "    if constexpr (!B) gone();  // comment\n"
            "    if constexpr (D > 2) kept();\n"
            "    x = (B ? left(1) : (right));\n"
            "}\n")
    out = steps.specialize(text, {"A": 2, "B": True})
    assert "two();" in out and "one();" not in out and "three();" not in out
    assert "gone()" not in out and "said of the next line" not in out
    assert "if constexpr (D > 2) kept();" in out, "a condition over anything but the switches stays"
    assert "x = left(1);" in out
    assert "    two();\n" in out, "the chosen block moves out one level"
    out = steps.specialize(text, {"A": 1, "B": False})
    assert "one();" in out and "gone();  // comment" in out and "x = (right);" in out


def test_specialize_decides_an_or_over_a_switch_and_a_paragraph_only_one_switch_uses():
    text = ("void f() {\n"
            "    // Only with B: state the branch below needs.\n    int kept = 0;\n    int too = 1;\n\n"
            "    if (B || x < (y + 1)) {\n        g();\n    }\n"
            "}\n")
    on, off = steps.specialize(text, {"B": True}), steps.specialize(text, {"B": False})
    assert "int kept = 0;\n    int too = 1;" in on and "Only with B" in on and "if (true) {" in on
    assert "kept" not in off and "too" not in off and "if (x < (y + 1)) {" in off
    assert off.startswith("void f() {\n    if (x"), "the paragraph goes with the blank line after it"


def test_an_unknown_step_is_a_clear_error():
    with pytest.raises(KeyError, match="no chapter-7 step"):
        steps.step_source("7.99")


# ---- the pages' reading of records (attnlab.book.climb) -----------------------------------------

def _timed(us: dict[str, float]):
    """A synthetic bench record at chapter 7's target shapes, each kernel timed at its own µs."""
    from synthetic import synthetic_record

    from attnlab.book import climb

    kids = list(us)
    rec = synthetic_record(kernel=kids[0], also=kids[1:], shapes=[tuple(s) for s in climb.TARGET_SHAPES])
    for case in rec["cases"]:
        for kid, t in us.items():
            case["kernels"][kid]["device"]["median_us"] = t
    return rec


def test_a_step_is_timed_against_the_step_before_only_from_a_record():
    from attnlab.book import climb

    empty = climb.Timings(None)
    assert empty.step_sentence("7.3") is None and empty.ratio("07_mma", "07_mma_nosplit", climb.MISSION, False) is None
    assert climb.measured_or(None, "what holds without one").startswith("**Not measured here.**")
    timings = climb.Timings(_timed({"07_mma_single_buffer": 50.0, "07_mma_longest_first": 100.0}))
    assert timings.ratio("07_mma_single_buffer", "07_mma_longest_first", climb.MISSION, True) == pytest.approx(0.5)
    text = timings.step_sentence("7.3")
    assert text.startswith("**Measured.** On ") and "0.50x at (1, 8, 512, 64)" in text
    assert text.count("0.50x") == len(climb.TARGETS) and text.endswith("the time of `07_mma_longest_first`.")
    assert timings.step_sentence("7.4") is None, "a record without the step says nothing of it"


def test_the_climb_measured_holds_each_step_over_the_one_before():
    from attnlab.book import climb

    us = {s.kernel_id: 100.0 / (i + 1) for i, s in enumerate(STEPS_07)}
    header, rows = climb.climb_measured_rows(climb.Timings(_timed(us)))
    assert len(rows) == len(STEPS_07) - 1 and len(header) == 1 + len(climb.TARGETS)
    assert rows[0][0] == "7.2 over 7.1" and rows[0][1] == f"{us['07_mma_longest_first'] / us['07_mma_plain']:.2f}x"
    n = len(STEPS_07)
    assert rows[-1][0] == f"7.{n} over 7.{n - 1}" and rows[-1][1] == f"{(100 / n) / (100 / (n - 1)):.2f}x"


def test_the_climb_folds_into_parts_that_hold_every_step_once(monkeypatch):
    """The overview's tables, one per part of the climb: every step in exactly one part, in order,
    each table under its part's title with its own steps' rows; a part list out of the steps' order
    is refused rather than shown."""
    from test_book import CH07_MAX_TABLE_ROWS

    from attnlab.book import climb

    seen = [s.number for _, members in climb.parts() for s in members]
    assert seen == [s.number for s in STEPS_07]
    assert all(len(members) <= CH07_MAX_TABLE_ROWS for _, members in climb.parts()), "a part over the page test's rows"
    rows = [[s.number] for s in STEPS_07[1:]]  # the measured tables: one row per step past the first
    text = climb.tables_by_part(["step"], STEPS_07[1:], rows)
    (first_title, first), (second_title, second) = climb.parts()
    assert text.startswith(f"**{first_title}** (steps {first[0].number}–{first[-1].number})")
    part_one, part_two = text.split(f"**{second_title}**")
    assert [f"| {s.number} |" in part_one for s in STEPS_07[1:]] == [s in first for s in STEPS_07[1:]]
    assert all(f"| {s.number} |" in part_two for s in second)
    monkeypatch.setattr(climb, "PARTS_07", (("7.7", "late"), ("7.1", "early")))
    with pytest.raises(ValueError, match="must start at step 7.1"):
        climb.parts()


def _at_ratios(ratios: dict[str, float], failed: tuple[str, int] | None = None):
    """A synthetic record at chapter 7's target cases where each kernel runs `ratio` times as fast
    as the run's flash backend (its fastest); `failed`: (kernel, target index) whose check failed."""
    from attnlab.book import climb

    rec = _timed({kid: 1.0 for kid in ratios})
    for case in rec["cases"]:
        i = next(i for i, (s, c, _, _) in enumerate(climb.TARGETS) if list(s) == case["shape"] and c == case["causal"])
        for kid, x in ratios.items():
            case["kernels"][kid]["device"]["median_us"] = case["sdpa"]["flash"]["median_us"] / x
            if failed == (kid, i):
                case["kernels"][kid]["check"]["passed"] = False
    return rec


def test_the_chapters_kernel_is_the_step_that_met_the_most_goals():
    """Goals judged per step from one record: a ratio at or over the goal meets it (in bold), a
    failed check meets none; the best step passed every check, met the most goals, and of those
    ran fastest over the cases; a step the record does not time is shown as not timed and never
    chosen."""
    from attnlab.book import climb

    ratios = {"07_mma": 1.2, "07_mma_even_split": 3.0, "07_mma_lean_loop": 1.6, "07_mma_whole_tile_copy": 1.7}
    timings = climb.Timings(_at_ratios(ratios, failed=("07_mma_even_split", 0)))
    assert climb.goals_met(timings, "07_mma") == [False, False, True, True, True, True]
    assert climb.goals_met(timings, "07_mma_even_split") == [False] + [True] * 5, "a failed check meets no goal"
    assert climb.goals_met(timings, "07_mma_plain") is None
    assert climb.best_step(timings).kernel_id == "07_mma_whole_tile_copy", "6 of 6 and faster than step 7.11"
    header, rows = climb.goal_rows(timings)
    assert len(header) == 2 + len(climb.TARGETS) and len(rows) == len(STEPS_07)
    by_kid = {r[0].split("`")[1]: r for r in rows}
    assert by_kid["07_mma"][1:] == ["1.20x", "1.20x", "**1.20x**", "**1.20x**", "**1.20x**", "**1.20x**", "4 of 6"]
    assert by_kid["07_mma_even_split"][1] == "failed its check" and by_kid["07_mma_even_split"][-1] == "5 of 6"
    assert set(by_kid["07_mma_plain"][1:]) == {climb.MISSING}
    assert climb.best_step(climb.Timings(_at_ratios({"07_mma": 1.2}))).kernel_id == "07_mma"
    failed = _at_ratios({"07_mma": 1.2, "07_mma_two_row_blocks": 2.0}, failed=("07_mma_two_row_blocks", 0))
    assert climb.best_step(climb.Timings(failed)).kernel_id == "07_mma", "5 goals met, but a check failed"
    assert climb.best_step(climb.Timings(None)) is None


def test_a_steps_page_shows_its_diff_and_its_code():
    from attnlab.book import climb

    block = climb.diff_block("7.3")
    assert "```diff\n--- 7.2 07_mma_longest_first\n+++ 7.3 07_mma_single_buffer" in block
    assert f"{steps.changed_lines(steps.step_diff('7.2', '7.3'))} changed lines" in block
    drop = climb.code_dropdown("7.1")
    assert drop.startswith("::::{dropdown}") and "```cuda\n// SWIZZLE = false" in drop and drop.endswith("::::")


def _ahead(kernel_id: str) -> list[int]:
    """For each key tile warp 0 of the traced CTA reads at the mission shape: how many tiles past
    it its copies have been issued by then."""
    from attnlab.book.executor_view import pipeline_tiles
    from attnlab.executor.trace import trace
    from attnlab.shapes import MISSION

    cells = pipeline_tiles(trace(kernel_id, MISSION, False))
    steps = sorted(s for w, s in cells if w == 0)
    out = []
    for s in steps:
        for tile in cells[0, s][1]:
            issued = max(g for w, s2 in cells if w == 0 and s2 < s for g in cells[0, s2][0])
            out.append(issued - tile)
    return out


def test_the_executor_sees_step_7_4_copy_a_tile_ahead_and_7_3_not():
    single, double = _ahead("07_mma_single_buffer"), _ahead("07_mma_two_barriers")
    assert len(single) == len(double) == 8  # the mission shape's 512 keys in 64-key tiles
    assert single == [0] * 8, "one stage: nothing is copied before the tile it reads is done"
    assert double == [1] * 7 + [0], "two stages: the next tile is in flight while this one is read"


def test_the_model_sees_the_launch_order_only_where_the_mask_makes_ctas_unequal():
    from attnlab.book import predicted
    from attnlab.shapes import MISSION

    def l4(kid, causal):
        return predicted.predictions(kid, MISSION, causal, ("L4",))["L4"].time_us

    assert l4("07_mma_longest_first", True) < l4("07_mma_plain", True)
    assert l4("07_mma_longest_first", False) == pytest.approx(l4("07_mma_plain", False))
