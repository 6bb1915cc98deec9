"""`python -m attnlab`: list, inspect, check, trace, bench, sanitize, search, tuned, profile,
verify-results, import-evidence, report, mutate, weigh, prebuild."""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

from .kernels import registry


class UsageError(Exception):
    """A command asked for what it cannot do: an unknown id, a shape no kernel takes, a missing file,
    no GPU for a GPU command. main() prints it as one line, `attnlab CMD: message`, and returns 2."""


class _Parser(argparse.ArgumentParser):
    """argparse's own complaints as one line, not a usage block: the block hides the one line that
    says what is wrong. main() prints the line and returns 2 (argparse would exit)."""

    def error(self, message):
        raise UsageError(f"{self.prog}: error: {message} (see --help)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _bool(text: str) -> bool:
    value = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
    return value


def _arch(text: str) -> str:
    """A GPU target, sm_ and a compute capability (sm_89, sm_90a). Which ones nvcc builds for is
    nvcc's to say; this only keeps a typo from reaching it as a build failure."""
    from .kernels.static import ARCHES

    if text not in ARCHES and not re.fullmatch(r"sm_\d{2,3}[af]?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU target like {', '.join(ARCHES)}")
    return text


def _unknown(what: str, name: str, known, where: str) -> UsageError:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return UsageError(f"unknown {what} {name!r}; {hint}{where}")


def _kernels(ids) -> list:
    """The kernels named on the command line (all of them when none is), checked before anything
    needs a GPU or a compiler, so a typo is named as a typo on any machine."""
    for kid in ids or ():
        if kid not in registry.KERNELS:
            raise _unknown("kernel", kid, registry.KERNELS, "`python -m attnlab list` shows the registered ids")
    return registry.select(ids)


def _check_shape(shape, specs, named: bool, causal: bool = False) -> None:
    """A --shape must suit the kernels: every kernel named must take it; with none named (all of
    them, and bench and profile skip those that cannot take it) at least one must."""
    from .kernels.contract import shape_problem

    problems = [p for s in specs if (p := shape_problem(s, shape, causal))]
    text = "--shape " + " ".join(map(str, shape))
    if named and problems:
        raise UsageError(f"{text}: {problems[0]}")
    if problems and len(problems) == len(specs):
        if not any(s.supports_head_dim(shape.D) for s in specs):
            raise UsageError(f"{text}: no kernel supports head dim D={shape.D} "
                             "(`python -m attnlab list` shows each kernel's head dims)")
        raise UsageError(f"{text}: no kernel takes it ({problems[0]})")


def cmd_list(args) -> int:
    specs = registry.select(None)
    w_id = max(len(s.id) for s in specs)
    w_src = max(len(s.source) for s in specs)
    w_d = max(len(s.head_dim_text()) for s in specs)
    print(f"{'id':<{w_id}} {'ch':>2}  {'head dims':<{w_d}} {'causal':<6} {'source':<{w_src}} summary")
    for s in specs:
        print(f"{s.id:<{w_id}} {s.chapter:>2}  {s.head_dim_text():<{w_d}} {str(s.causal):<6} "
              f"{s.source:<{w_src}} {s.summary}")
    return 0


def cmd_inspect(args) -> int:
    from tqdm.auto import tqdm

    from .kernels import toolchain
    from .kernels.compile import KernelBuildError
    from .kernels.static import build, classify, inspect_kernel, opcode_counts

    specs = _kernels(args.kernels)
    # Both tools up front: without one, a single line (ToolMissing, in main), not one failure per build.
    toolchain.nvcc()
    toolchain.cuobjdump()
    # each target built with its own tiles (chapter 7's key tile and stages follow the architecture)
    work = [(registry.get(s.id, a), a) for s in specs for a in args.arch]

    def one(job):
        """The id's report on the target, and the SASS opcode counts of each of its functions (the
        report's own counts are over all of them; the build is in this process's cache by now)."""
        try:
            rep = inspect_kernel(*job)
        except KernelBuildError as exc:
            return exc, None
        sass = build(*job).sass
        return rep, {f.name: opcode_counts(sass, [f.name]) for f in rep.functions}

    reports, per_function, failures = [], [], []
    # nvcc runs in subprocesses: one build per core on a cold cache; a warm one compiles nothing.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for (spec, _), (rep, by_fn) in zip(work, tqdm(pool.map(one, work), total=len(work), desc="nvcc",
                                                      unit="build", disable=args.json)):
            if isinstance(rep, KernelBuildError):
                failures.append(str(rep))
                continue
            reports.append(rep)
            per_function.append(by_fn)
            failures += [f"{spec.id}: {p}" for p in rep.problems]
    if args.json:
        out = []
        for rep, by_fn in zip(reports, per_function):
            d = rep.to_dict()
            for f in d["functions"]:
                f["sass"] = dict(sorted(by_fn[f["name"]].items()))
                f["sass_by_class"] = classify(by_fn[f["name"]])
            out.append(d)
        print(json.dumps(out, indent=1))
    else:
        print(inspect_table(reports, per_function))
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    if failures:
        return 1
    print(f"{len(reports)} builds, no spill, shared memory within each target's limit per block", file=sys.stderr)
    return 0


# inspect's SASS columns: a header and the instruction classes (attnlab.kernels.static.SASS_CLASSES) it sums.
SASS_COLUMNS = (("tensor", ("tensor core",)), ("fp32", ("fp32 math",)), ("lds", ("shared load",)),
                ("sts", ("shared store",)), ("ldg", ("global load",)), ("cp.async", ("async copy",)),
                ("bar", ("barrier",)))


def inspect_table(reports, per_function) -> str:
    """One row per function, target and registry id that launches it (a source shared by several
    ids shows each id's own entries, with the dynamic shared memory of that id's launches). The SASS
    columns count that function's own instructions (`per_function`: one {function: opcode counts}
    per report)."""
    from .kernels.static import classify

    kw = max([len(r.kernel) for r in reports] + [6])
    fw = max([len(f.name) for r in reports for f in r.functions] + [8])
    cw = [max(len(head), 6) for head, _ in SASS_COLUMNS]
    lines = [f"{'kernel':<{kw}} {'function':<{fw}} {'arch':<6} {'regs':>4} {'smem':>7} {'dyn smem':>8} "
             f"{'stack':>5} {'spill':>5}  {'SASS':>6} " + " ".join(f"{h:>{w}}" for (h, _), w in zip(SASS_COLUMNS, cw))]
    for r, by_function in zip(reports, per_function):
        for f in r.functions:
            ops = by_function[f.name]
            cls = classify(ops)
            sass = f"{sum(ops.values()):>6} " + " ".join(f"{sum(cls[n] for n in names):>{w}}"
                                                         for (_, names), w in zip(SASS_COLUMNS, cw))
            lines.append(f"{r.kernel:<{kw}} {f.name:<{fw}} {r.arch:<6} {f.registers:>4} {f.static_smem:>7} "
                         f"{f.dynamic_smem:>8} {f.stack_bytes:>5} {f.spill_stores + f.spill_loads:>5}  {sass}")
    return "\n".join(lines)


def _require_gpu(what: str, instead: str = "use `inspect` and `verify-results` without one") -> None:
    """Called after the arguments are checked: a wrong id is named as such on any machine.
    `instead` says what runs here in its place."""
    from .env import has_gpu

    if not has_gpu():
        raise UsageError(f"no CUDA GPU here (torch.cuda.is_available() is False). `{what}` measures on a GPU "
                         f"and never fakes a result; {instead}.")


def _shapes(args, specs) -> list | None:
    """The --shape values (None when there are none), checked against the kernels before any GPU
    check or build: one shape, every kernel named must take it; several shapes for named kernels,
    each must take one of them, and is left out, saying so, where it cannot (bench records that as
    skipped); no kernel named, at least one kernel must take each shape."""
    from .kernels.contract import shape_problem
    from .shapes import Shape

    if not args.shape:
        return None
    shapes = list(dict.fromkeys(Shape(*s) for s in args.shape))
    several = bool(args.kernels) and len(shapes) > 1
    for shape in shapes:
        _check_shape(shape, specs, named=bool(args.kernels) and not several)
    if several:
        for spec in specs:
            problems = [p for shape in shapes if (p := shape_problem(spec, shape))]
            if len(problems) == len(shapes):
                raise UsageError(f"{spec.id} takes none of the shapes given: {problems[0]}")
            for p in problems:
                print(f"left out: {p}", file=sys.stderr)
    return shapes


def _targets(args) -> list[tuple[str, object]]:
    """check --cpu's kernels as (label, spec): each id built with the tiles of its target, the
    `@sm_XY` of its label (as the CPU suite names them, e.g. 07_mma@sm_90) or else --arch, else the
    GPU at hand's (the L4's sm_89 without one). All of them when none is named. Checked before any
    build: an unknown id or a target without a tiles table is refused."""
    from .executor.cpu import cpu_label
    from .gpus import SM_LIMITS

    def target(arch: str | None, where: str) -> str | None:
        if arch is None:
            return None
        try:
            _arch(arch)
        except argparse.ArgumentTypeError as exc:
            raise UsageError(f"{where}: {exc}") from None
        if arch not in SM_LIMITS:
            raise UsageError(f"{where}: no tiles table for {arch} (attnlab knows {', '.join(SM_LIMITS)}); a GPU "
                             "of that target takes the source's own tiles, which --arch sm_89 checks")
        return arch

    default = target(args.arch, f"--arch {args.arch}")
    out = []
    for label in args.kernels or [s.id for s in registry.select(None)]:
        kid, at, arch = label.partition("@")
        if kid not in registry.KERNELS:
            raise _unknown("kernel", kid, registry.KERNELS, "`python -m attnlab list` shows the registered ids")
        arch = target(arch, label) if at else default
        spec = registry.get(kid, arch)
        out.append((cpu_label(spec, arch), spec))
    return list(dict(out).items())  # a kernel named twice (07_mma and 07_mma@sm_89 here) runs once


# A shape past this much work (B * H * L * L * D) may take a minute or more a case on the CPU
# executor: twice the mission shape's, (1, 8, 512, 64), at which chapter 3 takes about 23 s a launch
# with its race check (README's table of executor times); at (1, 8, 1024, 64) chapter 1 took 81 s.
# The CPU grid's longest shape, (1, 2, 641, 128), is 105 M.
CPU_SLOW_WORK = 2 * 8 * 512 * 512 * 64


def cmd_check_cpu(args) -> int:
    """check --cpu: the kernels on the CPU executor at small shapes (or --shape), with its
    findings; no record (records hold GPU results)."""
    from .executor.build import ExecutorUnavailable
    from .executor.cpu import CPU_SCHEDULE_SEEDS, format_table_cpu, run_suite_cpu

    if args.probe:
        raise UsageError("--probe is a GPU session's crash probe; on the CPU, --quick runs one seed "
                         "(and --shape the shapes you name)")
    targets = _targets(args)
    specs = [spec for _, spec in targets]
    shapes = _shapes(args, specs)
    seeds = CPU_SCHEDULE_SEEDS[:1] if args.quick else CPU_SCHEDULE_SEEDS
    for shape in shapes or ():
        if shape.heads * shape.L * shape.L * shape.D > CPU_SLOW_WORK:
            print(f"note: {shape.label()} is large for the CPU executor (every thread of every block runs "
                  "in turn on one core): a case may take a minute or more, and a launch past 300 s is "
                  "reported as a timeout", file=sys.stderr)
    try:
        cases = run_suite_cpu(specs, shapes=shapes, seeds=seeds, labels=[label for label, _ in targets])
    except ExecutorUnavailable as exc:  # no C++ compiler: the machine cannot do it, as without a GPU
        raise UsageError(f"--cpu: {exc}") from None
    print(format_table_cpu(cases))
    return 0 if all(c.passed for c in cases) else 1


def cmd_trace(args) -> int:
    """trace: one kernel at one shape on the CPU executor with its counts on: the totals next to the
    ideal, then per source line (--json: the whole record, with every event of the traced CTA)."""
    from .executor.build import ExecutorUnavailable
    from .executor.trace import format_trace, to_json, trace
    from .shapes import MISSION, Shape

    (label, spec), = _targets(argparse.Namespace(kernels=[args.kernel], arch=args.arch))
    shape = Shape(*args.shape) if args.shape else MISSION
    _check_shape(shape, [spec], named=True, causal=args.causal)
    if args.causal and not spec.causal:
        raise UsageError(f"{spec.id} has no causal mask")
    ctas = spec.launch_config(shape)["grid"]
    n_ctas = ctas[0] * ctas[1] * (ctas[2] if len(ctas) > 2 else 1)
    if args.cta is not None and args.cta >= n_ctas:
        raise UsageError(f"--cta {args.cta}: {spec.id} launches {n_ctas} CTAs at {shape.label()} (0..{n_ctas - 1})")
    if shape.heads * shape.L * shape.L * shape.D > CPU_SLOW_WORK:
        print(f"note: {shape.label()} is large for the CPU executor: this may take minutes", file=sys.stderr)
    try:
        t = trace(spec, shape, args.causal, args.cta if args.cta is not None else 0, arch=label.partition("@")[2] or None)
    except ExecutorUnavailable as exc:
        raise UsageError(f"trace: {exc}") from None
    print(json.dumps(to_json(t), indent=1) if args.json else format_trace(t))
    return 0 if t.completed and not t.findings else 1


def cmd_mutate(args) -> int:
    """mutate: every listed plausible mistake, applied to a scratch copy of kernels/, must fail the
    CPU suite (no GPU needed)."""
    from .executor import mutation
    from .executor.build import ExecutorUnavailable, compiler

    known = [m.id for m in mutation.MUTANTS]
    for mid in args.mutants:
        if mid not in known:
            raise _unknown("mutant", mid, known, f"known: {', '.join(known)}")
    chosen = [mutation.get(m) for m in args.mutants] if args.mutants else list(mutation.MUTANTS)
    try:
        compiler()
    except ExecutorUnavailable as exc:
        raise UsageError(str(exc)) from None
    outcomes = mutation.run_all(chosen, jobs=args.jobs)
    print(mutation.format_table(outcomes))
    return 0 if all(o.ok for o in outcomes) else 1


def cmd_weigh(args) -> int:
    """weigh: a kernel edit (a patch of kernels/) predicted by the book's time model against kernels/
    as it is, per kernel, shape, mask and GPU (no GPU needed)."""
    from pathlib import Path

    from .executor.build import ExecutorUnavailable, compiler
    from .gpus import GPUS
    from .kernels import toolchain
    from .model.bounds import ARCH_RATES, PREDICTED_GPUS
    from .model.weigh import EditFails, EditRefused, format_rows, patched_files, weigh
    from .shapes import MISSION, Shape

    patch = Path(args.patch)
    if not patch.is_file():
        raise UsageError(f"{patch}: no such patch file")
    specs = _kernels(args.kernels)
    gpus = args.gpu or list(PREDICTED_GPUS)
    known = [g.key for g in GPUS if g.arch in ARCH_RATES]
    for g in gpus:
        if g not in known:
            raise _unknown("GPU", g, known, f"the model predicts for: {', '.join(known)}")
    shapes = [Shape(*s) for s in args.shape] if args.shape else [MISSION]
    for shape in shapes:
        _check_shape(shape, specs, named=True)
    try:
        patched_files(patch)
        compiler()
        toolchain.nvcc()  # the model reads the SASS of both sides' builds
        rows = weigh(patch, [s.id for s in specs], shapes, gpus,
                     (False, True) if all(s.causal for s in specs) else (False,))
    except EditFails as exc:  # it ran, and the edited kernels failed: a failure, not a refusal
        print(f"attnlab weigh: {exc}", file=sys.stderr)
        return 1
    except (EditRefused, ExecutorUnavailable) as exc:
        raise UsageError(str(exc)) from None
    except RuntimeError as exc:  # a side's process failed: its last line says where
        print(f"attnlab weigh: {exc}", file=sys.stderr)
        return 1
    print(format_rows(rows))
    return 0


def cmd_check(args) -> int:
    if getattr(args, "cpu", False):
        return cmd_check_cpu(args)
    for label in args.kernels:  # before the unknown-id check: "07_mma@sm_90" is no typo
        if "@" in label and label.partition("@")[0] in registry.KERNELS:
            raise UsageError(f"{label}: a target's tiles are checked on the CPU executor (add --cpu); on a GPU, "
                             "check builds each kernel for the GPU at hand")
    if args.arch:
        raise UsageError(f"--arch {args.arch} goes with --cpu; on a GPU, check builds each kernel for the GPU at hand")
    specs = _kernels(args.kernels)
    shapes = _shapes(args, specs)
    words = " ".join([*args.kernels, "--cpu", *(["--quick"] if args.quick else []),
                      *(f"--shape {' '.join(map(str, s))}" for s in shapes or ())])
    _require_gpu("check", f"`python -m attnlab check {words}` runs the same kernels here on attnlab's CPU "
                          "executor (correctness and findings, no timing); `inspect` and `verify-results` "
                          "need no GPU either")
    from .gpu.check import CHECK_SEEDS, format_table, run_suite
    from .records.results import new_record, write_record
    from .shapes import PROBE_SHAPES

    seeds = CHECK_SEEDS[:1] if args.quick or args.probe else CHECK_SEEDS
    results = run_suite(specs, shapes=shapes or (PROBE_SHAPES if args.probe else None), seeds=seeds)
    print(format_table(results))
    if args.probe:
        _mark_probed(specs, results)
    if shapes and not args.probe and not args.no_record:
        print("record: none (a check at the shapes you name is not the suite; records hold the suite)")
    # a probe is no check, and a check at chosen shapes no suite: neither makes a record
    if not args.no_record and not args.probe and not shapes:
        record = new_record("check", specs, settings={"quick": args.quick, "seeds": list(seeds)})
        record["cases"] = [r.to_dict() for r in results]
        print(f"record: {write_record(record)}")
    return 0 if all(r.passed for r in results) else 1


def _probe_dir():
    """Where `check --probe` marks the kernels that came through (a GPU session's working folder)."""
    import os
    from pathlib import Path

    work = os.environ.get("ATTNLAB_SESSION_WORK")
    return Path(work) / "probed" if work else None


def _mark_probed(specs, results) -> None:
    folder = _probe_dir()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        if all(r.passed for r in results if r.kernel == spec.id):
            (folder / spec.id).touch()


def cmd_bench(args) -> int:
    from .shapes import BENCH_SHAPES, QUICK_SWEEP_LENGTHS, SWEEP_LENGTHS, sweep

    specs = _kernels(args.kernels)
    # Several shapes for named kernels (chapter 7's targets: one run, one record): a kernel that
    # cannot take one is left out of it, saying so (run_bench records it as skipped).
    shapes = _shapes(args, specs) or list(dict.fromkeys(
        BENCH_SHAPES + sweep(QUICK_SWEEP_LENGTHS if args.quick else SWEEP_LENGTHS)))
    _require_gpu("bench")
    from .gpu.bench import failed_cases, run_bench
    from .records.results import write_record

    if args.only_probed:
        # After the GPU check: a session's rehearsal without a GPU runs this very line and reads
        # the refusal for want of a GPU (session.NO_GPU_LINE).
        folder = _probe_dir()
        if folder is None:
            raise UsageError("--only-probed: ATTNLAB_SESSION_WORK is not set (a GPU session's stage sets it)")
        left_out = [s.id for s in specs if not (folder / s.id).exists()]
        for kid in left_out:
            print(f"not timed: {kid} (it failed, crashed or hung in its probe)", file=sys.stderr)
        specs = [s for s in specs if s.id not in left_out]
        if not specs:
            print("attnlab bench: no kernel came through its probe", file=sys.stderr)
            return 1
    record = run_bench(specs, shapes, quick=args.quick)
    failed = failed_cases(record)
    for kid, shape, causal in failed:
        print(f"FAIL {kid} {shape} causal={causal}: wrong output, so it was not timed (the record marks it FAILED)",
              file=sys.stderr)
    if not args.no_record:
        print(f"record: {write_record(record)}")
    _print_report(None)
    return 1 if failed else 0


def cmd_sanitize(args) -> int:
    from .gpu.sanitize import run_child, sanitize

    if args.child:
        return run_child(args.child)
    specs = _kernels(args.kernels)
    _require_gpu("sanitize", "`python -m attnlab check --cpu` runs the kernels here on attnlab's CPU executor, "
                             "which reports races, out-of-bounds and uninitialized reads and barrier misuse")
    from tqdm.auto import tqdm

    from .records.results import new_record, write_record

    work = [(s, t) for s in specs for t in args.tool]
    cases = []
    for spec, tool in tqdm(work, desc="compute-sanitizer", unit="run"):
        res = sanitize(spec.id, tool)
        cases.append(res)
        print(f"{spec.id:<14} {tool:<10} {'clean' if res['clean'] else 'ERRORS'} ({res['errors']} reported)")
        if not res["clean"]:
            print(res["report_tail"], file=sys.stderr)
    if not args.no_record:
        record = new_record("sanitize", specs, settings={"tools": list(args.tool)})
        record["cases"] = cases
        print(f"record: {write_record(record)}")
    return 0 if all(c["clean"] for c in cases) else 1


def _shape(values):
    from .shapes import MISSION, Shape

    return MISSION if values is None else Shape(*values)


def cmd_search(args) -> int:
    """Without a GPU: the static space (arithmetic rules, then nvcc). With one: the search."""
    from .env import has_gpu
    from .gpu import search

    kernels = args.kernels or ["07_mma"]
    shape = _shape(args.shape)
    for spec in _kernels(kernels):
        if spec.id not in search.searchable():
            raise UsageError(f"{spec.id} has no knobs to search; searchable: {', '.join(search.searchable())}")
        for causal in args.causal:
            _check_shape(shape, [spec], named=True, causal=causal)
    if args.static or not has_gpu():
        if not args.static:
            print("attnlab search: no CUDA GPU here (torch.cuda.is_available() is False), so nothing is "
                  "measured; the static space follows (--static shows it on a GPU machine too).", file=sys.stderr)
        for kid in kernels:
            # A progress bar on stderr, as inspect's: on a cold cache the space is minutes of nvcc.
            verdicts = search.static_space(kid, shape.D, args.arch, progress=not args.json)
            if args.json:
                print(json.dumps([v.to_dict() for v in verdicts], indent=1))
                continue
            ok = [v for v in verdicts if v.ok]
            print(f"{kid} at D={shape.D} on {args.arch}: {len(verdicts)} configurations, {len(ok)} pass the static gate")
            for v in verdicts:
                occ = (f"{v.occupancy.blocks_per_sm} blocks/SM ({v.occupancy.fraction:.0%}, {v.occupancy.limiter})"
                       if v.occupancy else "")
                regs = f"{v.registers} regs" if v.registers is not None else "not built"
                status = "ok  " if v.ok else "REFUSED"
                print(f"  {status} {search.config_text(v.config, kid, shape.D):<48} {regs:>10} "
                      f"{v.smem:>7} B smem  {occ}{'' if v.ok else '  ' + v.problems[0]}")
        return 0  # the static space is the command's job without a GPU: done
    from .records.results import write_record

    status = 0
    for kid in kernels:
        for causal in args.causal:
            rec = search.run_search(kid, shape, causal, strategy=args.strategy, budget_s=args.budget,
                                    seed=args.seed, population=args.population, generations=args.generations,
                                    reps=args.reps)
            s = rec["search"]
            best = s["best"]
            base = s["default"] or {}
            print(f"{kid} {shape.label()} causal={causal}: {s['strategy']}, {len(rec['cases'])} tried "
                  f"({s['counts']}), stopped: {s['stopped']}")
            if best:
                print(f"  best  {search.config_text(best['config'], kid, shape.D):<48} {best['time_us']:9.2f} µs")
            if base.get("time_us"):
                print(f"  default{'':<46} {base['time_us']:9.2f} µs")
            if best is None:
                status = 1
            if not args.no_record:
                print(f"record: {write_record(rec)}")
    return status


def cmd_tuned(args) -> int:
    """The best configuration per (GPU, kernel, shape, causal) from fresh search records."""
    from .gpu.search import best_configs, config_text

    table = best_configs()
    if args.json:
        print(json.dumps([{"gpu": g, "kernel": k, "shape": list(s), "causal": c, **v}
                          for (g, k, s, c), v in sorted(table.items())], indent=1))
        return 0
    if not table:
        print("no fresh search record: every kernel launches with its chapter's constants "
              "(`python -m attnlab search KERNEL` on a GPU writes one)")
    for (gpu, kid, shape, causal), v in sorted(table.items()):
        gain = f" (default {v['default_us']:.2f} µs)" if v.get("default_us") else ""
        print(f"{gpu:<26} {kid:<20} {str(shape):<20} causal={str(causal):<5} "
              f"{config_text(v['config'], kid, shape[3]):<40} {v['time_us']:.2f} µs{gain}")
    return 0


def cmd_profile(args) -> int:
    from .gpu import profile

    if args.child:
        return profile.run_child(args.child, _shape(args.shape))
    metrics = args.metrics or list(profile.DEFAULT_METRICS)
    specs, shape = _kernels(args.kernels), _shape(args.shape)
    _check_shape(shape, specs, named=bool(args.kernels))
    from .env import has_gpu

    if not has_gpu():  # what it would run goes to stdout; stderr carries the one line of the refusal
        print("The command it would run for each kernel:")
        for spec in specs:
            if spec.supports_head_dim(shape.D):
                print("  " + " ".join(profile.ncu_command(spec.id, metrics, shape, python="python")))
        _require_gpu("profile")
    from .records.results import write_record

    record, failures = profile.run_profile(args.kernels or None, metrics, shape)
    for case in record["cases"]:
        values = ", ".join(f"{profile.METRICS[n].short if n in profile.METRICS else n}="
                           f"{m['value'] if m['value'] is not None else 'n/a'}" for n, m in case["metrics"].items())
        print(f"{case['kernel']:<20} causal={str(case['causal']):<5} {case['function']}: {values}")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    if record["cases"] and not args.no_record:
        print(f"record: {write_record(record)}")
    return 1 if failures or not record["cases"] else 0


def cmd_verify(args) -> int:
    from .records.results import verify

    v = verify()
    for p in v.problems:
        print(f"FAIL {p}", file=sys.stderr)
    for p in v.stale:
        print(f"{'FAIL' if args.strict else 'stale'} {p}", file=sys.stderr if args.strict else sys.stdout)
    for gpu, kid, path in v.fresh:
        print(f"fresh   {kid:<14} {gpu}  ({path})")
    for kid in v.missing:
        print(f"no fresh record: {kid} (awaits a GPU run: python -m attnlab bench {kid})")
    if v.superseded:
        print(f"{v.superseded} older entries of changed kernels are superseded by newer records")
    for path in v.local:
        print(f"local   {path} (measured from uncommitted changes: kept for reading, never shown)")
    ok = v.strict_ok if args.strict else v.ok
    print(f"verify-results {'ok' if ok else 'FAILED'}: {len(v.fresh)} fresh (GPU, kernel) pairs, "
          f"{len(v.missing)} kernels without a fresh record, {len(v.stale)} stale, {len(v.problems)} problems")
    return 0 if ok else 1


def cmd_prebuild(args) -> int:
    """What travels to a GPU machine (attnlab.session.prebuild.carried), built into attnlab's cache
    (ATTNLAB_CACHE); with --into, packed into DIR/prebuilt-<arch>.tar.xz (attnlab.session.carry)."""
    import shutil
    from pathlib import Path

    from .kernels import toolchain
    from .session.carry import MiB, archive_bound, pack
    from .session.prebuild import build_missing, carried

    toolchain.nvcc()  # no nvcc: one line (ToolMissing, in main) before any progress bar
    wanted = carried(args.arch)
    _, refused, _ = build_missing(wanted, desc=f"prebuild {args.arch}")
    for b, line in refused.items():
        print(f"{'FAIL' if b.required else 'not carried'} {line}", file=sys.stderr)
    if any(b.required for b in refused):
        return 1
    # a configuration nvcc refuses is the static gate's verdict on it, where it is searched
    builds = [b for b in wanted if b not in refused]
    counts: dict[tuple[str, bool], int] = {}
    for b in builds:
        counts[b.arch, b.cubin] = counts.get((b.arch, b.cubin), 0) + 1
    what = " and ".join(f"{n} {'cubins with their reports' if cubin else 'reports alone'} for {arch}"
                        for (arch, cubin), n in counts.items())
    if not args.into:
        print(f"{what} in attnlab's cache, by nvcc {toolchain.nvcc_version()}")
        return 0
    dest = Path(args.into)
    shutil.rmtree(dest / "cubin", ignore_errors=True)  # an earlier prepare's, unpacked or not
    for stale in dest.glob("prebuilt-*.tar.xz"):
        stale.unlink()
    try:
        archive, n_files = pack(builds, dest, args.arch)
    except ValueError as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        return 1
    print(f"{what}: {n_files} files packed into {archive}, {archive.stat().st_size / MiB:.1f} MiB "
          f"(bound {archive_bound(builds) / MiB:.1f} MiB), by nvcc {toolchain.nvcc_version()}")
    return 0


def cmd_exercises(args) -> int:
    """exercises: one line per exercise; exercises check ID FILE: the reader's file judged on the CPU
    executor, in a child process (a crashing kernel is a verdict too): its one-line verdict, and the
    hint when it fails. 0 passes, 1 fails."""
    from .exercises.registry import EXERCISES, check

    if args.action is None:
        if args.id or args.file:
            raise UsageError("to check a file: `python -m attnlab exercises check ID FILE`")
        width = max(len(e) for e in EXERCISES)
        for ex in EXERCISES.values():
            print(f"{ex.id:<{width}}  ch{ex.chapter}  {ex.title}")
        return 0
    if not args.id or not args.file:
        raise UsageError("usage: python -m attnlab exercises check ID FILE (`python -m attnlab exercises` lists the ids)")
    if args.id not in EXERCISES:
        raise _unknown("exercise", args.id, EXERCISES, "`python -m attnlab exercises` lists them")
    from .exercises.workspace import missing_file_line

    missing = missing_file_line(args.id, args.file)  # relative to the cwd, and where the skeleton is from it
    if missing:
        raise UsageError(missing)
    from .executor.build import compiler

    try:
        compiler()  # no C++ compiler: a refusal that says what to install, not a failed exercise
    except Exception as exc:
        raise UsageError(str(exc)) from None
    verdict = check(args.id, args.file, isolate=True)
    print(verdict.line())
    if not verdict.passed and verdict.hint:
        print(f"hint: {verdict.hint}")
    return 0 if verdict.passed else 1


def cmd_import_evidence(args) -> int:
    from pathlib import Path

    from .session.evidence import main as import_main

    for archive in args.archives:  # a typo in a path is a usage mistake; a refused archive is not
        if not Path(archive).exists():
            raise UsageError(f"no such file: {archive}")
    return import_main(args.archives, run_nbval=not args.no_nbval, allow_rehearsal=args.allow_rehearsal)


def _print_report(as_json) -> None:
    from .paths import repo_root, results_dir
    from .records.results import report_rows

    rows = report_rows()
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    if not rows:
        folder = results_dir()
        where = "results/" if folder == repo_root() / "results" else str(folder)
        print(f"No fresh bench record under {where}: `python -m attnlab bench` on a GPU makes one.")
        return
    table = [("gpu", "kernel", "shape", "causal", "kernel µs", "SDPA", "SDPA µs", "vs SDPA", "check")]
    table += [(r["gpu"], r["kernel"], str(tuple(r["shape"])), str(r["causal"]),
               f"{r['median_us']:.1f}" if r["check_passed"] else "FAILED", r["sdpa_backend"],
               f"{r['sdpa_median_us']:.1f}", f"x{r['speedup_vs_sdpa']:.2f}" if r["check_passed"] else "",
               "pass" if r["check_passed"] else "FAIL") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    numeric = {4, 6, 7}
    for row in table:
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())


def cmd_report(args) -> int:
    _print_report(args.json)
    return 0


def cmd_run_cpu(args) -> int:
    """run-cpu: a reader's own .cu file on the CPU executor (attnlab.executor.reader_commands parses the
    --arg specs and prints): 0 clean, 1 with findings, 2 when it cannot run (a compile error too)."""
    from .executor.build import ExecutorUnavailable
    from .executor.reader_commands import run_command
    from .executor.reader_source import ReaderBuildError, ReaderError

    try:
        return run_command(args)
    except ReaderBuildError as exc:  # the compiler's first lines, not just the first
        print(f"attnlab run-cpu: {exc}", file=sys.stderr)
        return 2
    except (ReaderError, ExecutorUnavailable) as exc:
        raise UsageError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    from .kernels.static import ARCHES

    p = _Parser(prog="python -m attnlab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    sub.add_parser("list", help="the registered kernels").set_defaults(fn=cmd_list)
    sp = sub.add_parser("inspect", help="static build, resources and SASS mix of each function (no GPU needed)")
    sp.add_argument("kernels", nargs="*", metavar="KERNEL")
    sp.add_argument("--arch", nargs="+", type=_arch, default=list(ARCHES), help="targets, e.g. sm_80 sm_89 sm_90")
    sp.add_argument("--json", action="store_true", help="machine-readable reports")
    sp.set_defaults(fn=cmd_inspect)
    for name, fn, text in (("check", cmd_check, ("the correctness suite on a GPU (writes a record); with --cpu, "
                                                  "here on attnlab's CPU executor (no GPU needed)")),
                           ("bench", cmd_bench, "timings next to SDPA on a GPU; writes a record")):
        sp = sub.add_parser(name, help=text, description=text)
        ids = "registered ids (default: all)"
        if name == "check":
            ids += "; with --cpu also ID@sm_XY, the tiles the kernel takes on that target (e.g. 07_mma@sm_90)"
        sp.add_argument("kernels", nargs="*", metavar="KERNEL", help=ids)
        sp.add_argument("--quick", action="store_true", help="fewer seeds / shapes / repetitions")
        sp.add_argument("--no-record", action="store_true", help="do not write a record under results/")
        if name == "check":
            sp.add_argument("--cpu", action="store_true",
                            help="run the kernels on attnlab's CPU executor (no GPU needed): the pass rule at "
                                 "small shapes, and races, out-of-bounds and other findings; never a timing, "
                                 "never a record")
            sp.add_argument("--arch", type=_arch, default=None,
                            help="with --cpu: build the kernels with the tiles they take on this target "
                                 "(default: the GPU at hand's, the L4's sm_89 without one; chapter 7's tiles "
                                 "follow it, e.g. sm_90 for the H100's three stages)")
            sp.add_argument("--shape", nargs=4, type=_positive_int, action="append", metavar=("B", "H", "L", "D"),
                            help="check at this shape (repeatable), causal and not, instead of the suite's "
                                 "shapes; on a GPU it writes no record")
            sp.add_argument("--probe", action="store_true",
                            help="one seed at two shapes, no record: does the kernel run and pass at all (a GPU "
                                 "session probes each kernel in its own process before timing them together)")
        else:
            sp.add_argument("--shape", nargs=4, type=_positive_int, action="append", metavar=("B", "H", "L", "D"),
                            help="time at this shape (repeatable) instead of the mission shape and the sweep")
            sp.add_argument("--only-probed", action="store_true",
                            help="time only the kernels `check --probe` passed in this GPU session")
        sp.set_defaults(fn=fn)
    sp = sub.add_parser("trace", help="one kernel on the CPU executor with its counts on (bytes, requests, "
                                      "wavefronts, sectors, tensor-core instructions, exponentials, barriers, "
                                      "shuffles) over every CTA and every event of one: measurements, never times")
    sp.add_argument("kernel", metavar="KERNEL", help="a registered id, or ID@sm_XY for the tiles of that target")
    sp.add_argument("--shape", nargs=4, type=_positive_int, metavar=("B", "H", "L", "D"),
                    help="default: the mission shape")
    sp.add_argument("--causal", action="store_true")
    sp.add_argument("--cta", type=int, default=None, metavar="N",
                    help="the CTA whose events are recorded (linear index, x fastest; default 0)")
    sp.add_argument("--arch", type=_arch, default=None, help="the tiles of this target (as check --cpu --arch)")
    sp.add_argument("--json", action="store_true", help="the whole record: totals, sites, per-CTA counts, events")
    sp.set_defaults(fn=cmd_trace)
    sp = sub.add_parser("mutate", help="plant each listed mistake in a scratch copy of the kernels and show the "
                                       "CPU suite catches it (no GPU needed); exit 1 on a survivor")
    sp.add_argument("mutants", nargs="*", metavar="MUTANT", help="ids from attnlab/executor/mutants.py (default: all)")
    sp.add_argument("--jobs", type=_positive_int, default=None, help="mutants run at once (default: up to 4)")
    sp.set_defaults(fn=cmd_mutate)
    sp = sub.add_parser("weigh", help="a kernel edit (a patch of kernels/) predicted by the book's time model "
                                      "against kernels/ as it is, after the edited kernels pass the CPU check "
                                      "(no GPU needed): predictions, never times")
    sp.add_argument("patch", metavar="PATCH", help="a patch of files under kernels/ (git diff's format)")
    sp.add_argument("kernels", nargs="+", metavar="KERNEL", help="registered ids to weigh")
    sp.add_argument("--gpu", action="append", metavar="GPU",
                    help="a GPU of the model's table (repeatable; default: the L4 and the H100 SXM)")
    sp.add_argument("--shape", nargs=4, type=_positive_int, action="append", metavar=("B", "H", "L", "D"),
                    help="weigh at this shape (repeatable; default: the mission shape), causal and not")
    sp.set_defaults(fn=cmd_weigh)
    sp = sub.add_parser("sanitize", help="compute-sanitizer on each kernel at small shapes (GPU); writes a record")
    sp.add_argument("kernels", nargs="*", metavar="KERNEL")
    sp.add_argument("--tool", nargs="+", default=["memcheck", "racecheck", "synccheck"],
                    choices=["memcheck", "racecheck", "synccheck", "initcheck"])
    sp.add_argument("--no-record", action="store_true")
    sp.add_argument("--child", metavar="KERNEL", help=argparse.SUPPRESS)
    sp.set_defaults(fn=cmd_sanitize)
    sp = sub.add_parser("search", help="chapter 8: search a kernel's knobs on a GPU (writes a record); "
                                       "without one, or with --static, the static space")
    sp.add_argument("kernels", nargs="*", metavar="KERNEL", help="default: 07_mma")
    sp.add_argument("--shape", nargs=4, type=_positive_int, metavar=("B", "H", "L", "D"),
                    help="default: the mission shape")
    sp.add_argument("--causal", nargs="+", type=_bool, default=[False],
                    metavar="BOOL", help="causal flags to search, e.g. --causal false true")
    sp.add_argument("--strategy", choices=["auto", "exhaustive", "evolve"], default="auto")
    sp.add_argument("--budget", type=_positive_float, default=300.0, help="seconds per search (no evaluation starts after)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--population", type=_positive_int, default=8)
    sp.add_argument("--generations", type=_positive_int, default=6)
    sp.add_argument("--reps", type=_positive_int, default=30, help="timed CUDA-graph replays per configuration")
    sp.add_argument("--static", action="store_true", help="only the static gate (no GPU needed)")
    sp.add_argument("--arch", type=_arch, default="sm_89", help="target of the static gate (default: the L4's sm_89)")
    sp.add_argument("--json", action="store_true", help="with --static: machine-readable verdicts")
    sp.add_argument("--no-record", action="store_true")
    sp.set_defaults(fn=cmd_search)
    sp = sub.add_parser("tuned", help="the best searched configuration per GPU and shape (fresh records)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_tuned)
    sp = sub.add_parser("exercises", help="the book's exercises: list them, or `exercises check ID FILE` to judge "
                                          "your file on the CPU executor (no GPU needed; exit 0 pass, 1 fail)")
    sp.add_argument("action", nargs="?", choices=["check"], help="check: judge FILE as exercise ID")
    sp.add_argument("id", nargs="?", metavar="ID", help="an exercise id, e.g. ch03-warp-reduce")
    sp.add_argument("file", nargs="?", metavar="FILE", help="your .cu file (start from exercises/ID.cu)")
    sp.set_defaults(fn=cmd_exercises)
    sp = sub.add_parser("profile", help="Nsight Compute metrics of each kernel at the mission shape (GPU); "
                                        "writes a record")
    sp.add_argument("kernels", nargs="*", metavar="KERNEL")
    sp.add_argument("--metrics", nargs="+", help="ncu metric names (default: the appendix's list)")
    sp.add_argument("--shape", nargs=4, type=_positive_int, metavar=("B", "H", "L", "D"),
                    help="default: the mission shape")
    sp.add_argument("--no-record", action="store_true")
    sp.add_argument("--child", metavar="KERNEL", help=argparse.SUPPRESS)
    sp.set_defaults(fn=cmd_profile)
    verify_p = sub.add_parser("verify-results", help="records well formed, bound and physical; which are fresh "
                                                     "(no GPU needed)")
    verify_p.add_argument("--strict", action="store_true",
                          help="also fail where the freshest record of a kernel is stale (after a GPU session "
                               "measured everything again)")
    verify_p.set_defaults(fn=cmd_verify)
    sp = sub.add_parser("prebuild", help="build what travels to a GPU session (every kernel's cubin for its "
                                         "target, chapter 8's static reports) into attnlab's cache "
                                         "(ATTNLAB_CACHE), with this machine's nvcc (no GPU needed)")
    sp.add_argument("--arch", type=_arch, default="sm_90", help="the GPU's target (default: sm_90, the H100's and H200's)")
    sp.add_argument("--into", metavar="DIR", help="then pack exactly those files into DIR/prebuilt-ARCH.tar.xz "
                                                  "(earlier ones removed), which a GPU session unpacks")
    sp.set_defaults(fn=cmd_prebuild)
    sp = sub.add_parser("import-evidence", help="bring a GPU session's archives into this checkout: records "
                                                "(refused if the kernels changed) and executed notebooks, then "
                                                "verify-results and nbval")
    sp.add_argument("archives", nargs="+", metavar="ARCHIVE", help="<stage>.tar.gz files of attnlab.session.stages")
    sp.add_argument("--no-nbval", action="store_true", help="skip nbval over the imported notebooks")
    sp.add_argument("--allow-rehearsal", action="store_true",
                    help="also take what a rehearsal without a GPU made (scripts/gpu_rehearse.sh's round trip)")
    sp.set_defaults(fn=cmd_import_evidence)
    sp = sub.add_parser("run-cpu", help="your own .cu kernel on the CPU executor: findings (races, out-of-bounds, "
                                        "...), bank counts and the arrays after the run (no GPU needed)")
    sp.add_argument("file", metavar="FILE.cu")
    sp.add_argument("--entry", metavar="NAME", help="the __global__ function (needed when the file has several)")
    sp.add_argument("--grid", default="1", metavar="X[,Y[,Z]]", help="blocks (default 1)")
    sp.add_argument("--block", default="32", metavar="X[,Y[,Z]]", help="threads a block (default 32)")
    sp.add_argument("--shared", type=int, default=0, metavar="N", help="dynamic shared memory bytes")
    sp.add_argument("--arg", action="append", default=[], metavar="SPEC",
                    help="one per parameter, in order: an int, a float, or KIND:DTYPE:SHAPE with KIND zeros, ones, "
                         "arange, rand, randn or full (full:DTYPE:SHAPE:VALUE), e.g. rand:float16:64x64")
    sp.add_argument("--seed", type=int, default=0, help="the schedule's and rand's seed")
    sp.set_defaults(fn=cmd_run_cpu)
    sp = sub.add_parser("report", help="kernel vs fastest SDPA backend from the freshest records")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_report)
    return p


def main(argv=None) -> int:
    """Run one command; its exit status: 0 done, 1 it ran and found a failure, 2 it could not run as
    asked (one line on stderr says why)."""
    from .kernels.compile import KernelBuildError
    from .kernels.toolchain import ToolMissing

    try:
        args = _parser().parse_args(argv)
    except UsageError as exc:  # from _Parser.error: the line is complete
        print(exc, file=sys.stderr)
        return 2
    try:
        return args.fn(args)
    except (UsageError, ToolMissing) as exc:
        first = str(exc).split("\n")[0]  # a tool's message may go on; the refusal is its first line
        print(f"attnlab {args.cmd}: {first}", file=sys.stderr)
        return 2
    except KernelBuildError as exc:  # the compiler refused a kernel: a failure, with its log
        print(f"attnlab {args.cmd}: {exc}", file=sys.stderr)
        return 1
