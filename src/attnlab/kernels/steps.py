"""Chapter 7's steps as code: the kernel of each step, and what changed since the step before.

Every step is kernels/07_mma_swizzle.cu built with its own template switches (SWIZZLE, STAGES,
ONE_BARRIER, LONGEST_FIRST, KV_SPLIT, ROW_BLOCKS, ACROSS_HEADS, WHOLE_TILES, SKIP_RESCALE, DEFER_PV), named
once, in the step's `ATTN07_ENTRY` line of the source.
The compiler drops the branches a switch turns off; `step_source` drops them the same way in the
text, so a reader sees the kernel each step builds: the `if constexpr` branches that do not apply
are gone, the ones that do are inlined, and `(SWITCH ? a : b)` is `a` or `b`. `step_diff` is the
unified diff of two steps' code: the technique the later step adds, and nothing else. A step that
changes the launcher instead (Step.rule) has the code of the step before and its rule's source.
"""
from __future__ import annotations

import ast
import difflib
import inspect
import re

from ..paths import kernels_dir
from .registry import STEPS_07, Step, get
from .source_constants import constants, macro_calls

SOURCE = "07_mma_swizzle.cu"
ENTRY_MACRO = "ATTN07_ENTRY"
# The template switches a step sets, in the order the code view lists them. D and BLOCK_N are
# sizes, not techniques: they stay symbolic.
SWITCHES = ("SWIZZLE", "STAGES", "ONE_BARRIER", "LONGEST_FIRST", "KV_SPLIT", "ROW_BLOCKS", "ACROSS_HEADS",
            "WHOLE_TILES", "SKIP_RESCALE", "DEFER_PV")
# The helpers of the source a switch brings in, shown with the kernel where it is on.
HELPERS = {"WHOLE_TILES": "template <int D, int ROWS, bool SWIZZLE>\n__device__ __forceinline__ void load_whole_tile("}
# Chapter 7's steps never take FlashAttention-2's partial route (that is 07_mma_split_ctas).
FIXED = {"PARTIAL": False}
# Constants of the kernel the switches decide with the head dim: each resolved in a step's code too.
DERIVED = {"Q_FROM_TILE": lambda values, D: values["ROW_BLOCKS"] * D > 128}  # two row blocks at D = 128


def step_of(key: Step | str) -> Step:
    """A chapter-7 step by its number ("7.3") or kernel id (a Step is returned as it is)."""
    if isinstance(key, Step):
        return key
    for s in STEPS_07:
        if key in (s.number, s.kernel_id):
            return s
    raise KeyError(f"no chapter-7 step {key!r}; steps: {', '.join(s.number for s in STEPS_07)}")


def shown_entry(step: Step | str, head_dim: int | None = None) -> str:
    """The extern "C" entry whose code stands for the step at `head_dim` (shown_head_dim without
    one): for the key split, the 2-way split's, the smallest split that runs its merge."""
    spec = get(step_of(step).kernel_id, "sm_89")
    D = head_dim or shown_head_dim(step)
    if spec.entries_by_split:
        return spec.entries_by_split[min(spec.entries_by_split)][D]
    return spec.entry_for(D)


def shown_head_dim(step: Step | str) -> int:
    """The head dim whose code stands for the step: 64, unless the step runs the step before's
    entries there (step 7.13 at D = 64, whose two row blocks keep step 7.12's), then 128."""
    s = step_of(step)
    before = previous(s)
    if before is None or s.rule is not None:
        return 64
    same = entry_switches(shown_entry(s, 64)) == entry_switches(shown_entry(before, 64))
    return 128 if same else 64


def entry_switches(entry: str) -> dict[str, int | bool]:
    """The template switches the source's `ATTN07_ENTRY(entry, ...)` line gives `entry`; one passed
    as a named constant (STAGES_D64) takes the source's own value (the L4's)."""
    calls = macro_calls(SOURCE, ENTRY_MACRO)
    if entry not in calls:
        raise KeyError(f"{SOURCE} has no {ENTRY_MACRO} line for {entry}")
    named = constants(SOURCE)
    return {param: arg == "true" if arg in ("true", "false") else int(arg) if arg.isdigit() else named[arg]
            for param, arg in calls[entry].items()}


def step_switches(step: Step | str, head_dim: int | None = None) -> dict[str, int | bool]:
    """The step's switches (SWITCHES) at `head_dim` (shown_head_dim without one), from the source,
    with the L4's tiles."""
    values = entry_switches(shown_entry(step, head_dim))
    return {name: values[name] for name in SWITCHES}


# ---- reading C++ just far enough ----------------------------------------------------------------

def _skip_to_code(text: str, i: int) -> int:
    """The index of the first character at or after i that is not space or a comment."""
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text.startswith("//", i):
            i = text.index("\n", i) if "\n" in text[i:] else len(text)
        else:
            return i
    return i


def _match(text: str, i: int) -> int:
    """The index just past the bracket that closes the one at text[i] ('(' or '{'), skipping
    comments and string literals."""
    close = {"(": ")", "{": "}"}[text[i]]
    opening, depth = text[i], 0
    while i < len(text):
        c = text[i]
        if text.startswith("//", i):
            i = text.index("\n", i)
            continue
        if c == '"':
            i = text.index('"', i + 1) + 1
            continue
        if c == opening:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced brackets")


def _statement_end(text: str, i: int) -> int:
    """The index just past the statement that starts at text[i]: a block, or up to its ';'."""
    if text[i] == "{":
        return _match(text, i)
    depth = 0
    while True:
        c = text[i]
        if c in "({":
            depth += 1
        elif c in ")}":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1
        i += 1


def _evaluate(cond: str, values: dict) -> bool | None:
    """A C++ constant expression over the switches, or None when it names anything else."""
    py = re.sub(r"!(?!=)", " not ", cond).replace("&&", " and ").replace("||", " or ")
    py = py.replace("true", "True").replace("false", "False")
    tree = ast.parse(py.strip(), mode="eval")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if not names <= set(values):
        return None
    return bool(eval(compile(tree, "<switch>", "eval"), {"__builtins__": {}}, dict(values)))


def _line_start(text: str, i: int) -> int:
    return text.rfind("\n", 0, i) + 1


def _line_end(text: str, i: int) -> int:
    """Past the newline that ends the line holding text[i - 1] (and its trailing comment)."""
    j = text.find("\n", i)
    return len(text) if j < 0 else j + 1


def _dedent_block(body: str, indent: str) -> str:
    """The lines inside a `{ ... }` block, moved out one level to `indent`."""
    inner = body[1:-1].lstrip("\n").rstrip()  # the closing brace's indent is no line of the block
    lines = inner.split("\n")
    out = []
    for line in lines:
        if line.startswith(indent + "    "):
            line = indent + line[len(indent) + 4:]
        out.append(line.rstrip())
    return "\n".join(out) + "\n"


def _resolve_if(text: str, start: int, values: dict) -> tuple[str, int] | None:
    """The `if constexpr` chain at text[start:], replaced by the branch the switches take: (new
    text, where to go on searching), or None when a condition is not over the switches alone."""
    branches = []   # (condition value, body start, body end)
    i = start
    while True:
        paren = text.index("(", i + len("if constexpr"))
        close = _match(text, paren)
        value = _evaluate(text[paren + 1:close - 1], values)
        if value is None:
            return None
        body = _skip_to_code(text, close)
        end = _statement_end(text, body)
        branches.append((value, body, end))
        after = _skip_to_code(text, end)
        if text.startswith("else if constexpr", after):
            i = after + len("else ")
            continue
        if text.startswith("else", after) and not text[after + 4].isalnum():
            body = _skip_to_code(text, after + 4)
            end = _statement_end(text, body)
            branches.append((True, body, end))
        break
    indent = text[_line_start(text, start):start]
    if indent.strip():
        return None  # the if shares its line with other code: leave it
    chosen = next(((b, e) for v, b, e in branches if v), None)
    whole_start, whole_end = _line_start(text, start), _line_end(text, end)
    if chosen is None:  # the whole chain goes, with the comment lines just above it
        replacement = ""
        while whole_start > 0:
            above = _line_start(text, whole_start - 1)
            if not text[above:whole_start].strip().startswith("//"):
                break
            whole_start = above
    elif text[chosen[0]] == "{":
        replacement = _dedent_block(text[chosen[0]:chosen[1]], indent)
    else:  # a single statement on the if's line, with its comment unless that speaks of a switch
        statement, comment = text[chosen[0]:chosen[1]], text[chosen[1]:_line_end(text, chosen[1])]
        if re.search(rf"\b(?:{'|'.join(map(re.escape, values))})\b", comment):
            comment = "\n"
        replacement = indent + statement + comment
    return text[:whole_start] + replacement + text[whole_end:], whole_start


def _resolve_ternary(text: str, start: int, values: dict) -> tuple[str, int]:
    """`(SWITCH ? a : b)` at text[start:] replaced by a or b."""
    close = _match(text, start)
    inner = text[start + 1:close - 1]
    name, rest = inner.split("?", 1)
    depth = 0
    for k, c in enumerate(rest):
        depth += 1 if c == "(" else -1 if c == ")" else 0
        if c == ":" and depth == 0:
            a, b = rest[:k].strip(), rest[k + 1:].strip()
            break
    chosen = a if values[name.strip()] else b
    return text[:start] + chosen + text[close:], start


# A paragraph of declarations only one bool switch uses (a variable must outlive the `if constexpr`
# that fills it): it opens with a comment line "// Only with SWITCH ..." and ends at the first blank
# line; it goes where the switch is false.
_ONLY_WITH = re.compile(r"^[ \t]*// Only with (\w+)\b.*\n(?:[ \t]*\S.*\n)*(?:[ \t]*\n)?", re.M)


def specialize(text: str, values: dict) -> str:
    """`text` as the compiler sees it with the template switches `values`: every `if constexpr`
    over them resolved, every `(SWITCH ? a : b)` and `if (SWITCH || rest)` decided, every "Only with
    SWITCH" paragraph of a switch that is off dropped. What names anything else stays."""
    text = _ONLY_WITH.sub(lambda m: m.group(0) if values.get(m.group(1), True) else "", text)
    i = 0
    while (m := re.compile(r"if constexpr \(").search(text, i)) is not None:
        done = _resolve_if(text, m.start(), values)
        text, i = done if done is not None else (text, m.end())
    names = "|".join(re.escape(n) for n in values)
    pattern = re.compile(rf"\((?:{names}) \? ")
    while (m := pattern.search(text)) is not None:
        text, _ = _resolve_ternary(text, m.start(), values)
    # `if (SWITCH || rest)`: `if (rest)` with the switch off, `if (true)` with it on
    pattern = re.compile(rf"\bif \(({names}) \|\| ")
    while (m := pattern.search(text)) is not None:
        close = _match(text, m.start(1) - 1)  # the if's own parenthesis
        text = text[:m.start()] + ("if (true)" if values[m.group(1)] else "if (" + text[m.end():close]) + text[close:]
    return text


def _function(text: str, signature: str) -> str:
    """The definition that begins with the line holding `signature` (its `template <...>` line),
    through its closing brace."""
    start = _line_start(text, text.index(signature))
    body = text.index("{", text.index(")", text.index("(", start)))
    return text[start:_line_end(text, _match(text, body))]


def step_source(step: Step | str, head_dim: int | None = None) -> str:
    """The code of one step at `head_dim` (shown_head_dim without one): its switches,
    attn::tile_offset (kernels/swizzle.cuh), the helpers its switches bring in (HELPERS) and the
    kernel's body (attn_fwd_07), with every branch the switches decide resolved."""
    D = head_dim or shown_head_dim(step)
    values = {**entry_switches(shown_entry(step, D)), **FIXED}
    values = {name: values[name] for name in (*SWITCHES, *FIXED)}
    values |= {name: rule(values, D) for name, rule in DERIVED.items()}
    swizzle_h = (kernels_dir() / "swizzle.cuh").read_text()
    kernel = (kernels_dir() / SOURCE).read_text()
    head = "".join(f"// {n} = {str(values[n]).lower()}\n" for n in SWITCHES)
    parts = [_function(swizzle_h, "template <int ROW_BYTES, bool SWIZZLE>"),
             *(_function(kernel, signature) for switch, signature in HELPERS.items() if values[switch]),
             _function(kernel, "template <int D, int BLOCK_N, int KV_SPLIT, bool SWIZZLE")]
    code = head + "\n" + "\n".join(specialize(p, values) for p in parts)
    return re.sub(r"\n{3,}", "\n\n", code)  # a resolved branch leaves no run of blank lines


def step_diff(before: Step | str, after: Step | str, context: int = 2) -> str:
    """The unified diff from one step's code to the next's, both at the later step's shown head dim."""
    a, b = step_of(before), step_of(after)
    D = shown_head_dim(b)
    lines = difflib.unified_diff(step_source(a, D).splitlines(keepends=True), step_source(b, D).splitlines(keepends=True),
                                 fromfile=f"{a.number} {a.kernel_id}", tofile=f"{b.number} {b.kernel_id}",
                                 n=context)
    return "".join(lines)


def rule_source(step: Step | str) -> str | None:
    """The code of a launcher step's rule (Step.rule), as the module has it; None for a kernel step."""
    s = step_of(step)
    return inspect.getsource(s.rule) if s.rule is not None else None


def changed_lines(diff: str) -> int:
    """Lines a diff removes or adds (its file header not counted)."""
    return sum(1 for line in diff.splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---")))


def previous(step: Step | str) -> Step | None:
    """The step before this one (None for the first)."""
    s = step_of(step)
    k = STEPS_07.index(s)
    return STEPS_07[k - 1] if k else None
