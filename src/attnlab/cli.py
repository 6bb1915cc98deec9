"""`python -m attnlab`: list, inspect, check, bench, sanitize, search, tuned, profile,
verify-results, import-evidence, report, mutate, prebuild."""
from __future__ import annotations

import argparse
import json
import sys

from . import registry


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

    from .compile import KernelBuildError
    from .static import inspect_kernel

    specs = registry.select(args.kernels)
    work = [(s, a) for s in specs for a in args.arch]
    reports, failures = [], []
    for spec, arch in tqdm(work, desc="nvcc", unit="build", disable=args.json):
        try:
            rep = inspect_kernel(spec, arch)
        except KernelBuildError as exc:
            failures.append(str(exc))
            continue
        reports.append(rep)
        failures += [f"{spec.id}: {p}" for p in rep.problems]
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=1))
    else:
        width = max([len(f.name) for r in reports for f in r.functions] + [8])
        print(f"{'function':<{width}} {'arch':<6} {'regs':>4} {'smem':>7} {'dyn smem':>8} {'stack':>5} "
              f"{'spill':>5}  SASS of the file: total, tensor, fp32, shared ld/st, global ld")
        for r in reports:
            cls = r.sass_by_class()
            for f in r.functions:
                print(f"{f.name:<{width}} {r.arch:<6} {f.registers:>4} {f.static_smem:>7} {r.dynamic_smem_max:>8} "
                      f"{f.stack_bytes:>5} {f.spill_stores + f.spill_loads:>5}  {sum(r.sass.values())}, "
                      f"{cls['tensor core']}, {cls['fp32 math']}, {cls['shared load']}/{cls['shared store']}, "
                      f"{cls['global load']}")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    if failures:
        return 1
    print(f"{len(reports)} builds, no spill, shared memory within the L4's 99 KB per block", file=sys.stderr)
    return 0


def _gpu_or_exit(what: str) -> bool:
    from .env import has_gpu

    if not has_gpu():
        print(f"attnlab {what}: no CUDA GPU here (torch.cuda.is_available() is False). "
              f"`{what}` measures on a GPU and never fakes a result; use `inspect` and "
              "`verify-results` without one.", file=sys.stderr)
        return False
    return True


def cmd_check_cpu(args) -> int:
    """check --cpu: the kernels on the CPU executor at small shapes, with its findings; no record
    (records hold GPU results)."""
    from .cpu import CPU_SCHEDULE_SEEDS, format_table_cpu, run_suite_cpu
    from .executor import ExecutorUnavailable

    specs = registry.select(args.kernels)
    seeds = CPU_SCHEDULE_SEEDS[:1] if args.quick else CPU_SCHEDULE_SEEDS
    try:
        cases = run_suite_cpu(specs, seeds=seeds)
    except ExecutorUnavailable as exc:
        print(f"attnlab check --cpu: {exc}", file=sys.stderr)
        return 2
    print(format_table_cpu(cases))
    return 0 if all(c.passed for c in cases) else 1


def cmd_mutate(args) -> int:
    """mutate: every listed plausible mistake, applied to a scratch copy of kernels/, must fail the
    CPU suite (no GPU needed)."""
    from . import mutation
    from .executor import ExecutorUnavailable, compiler

    try:
        compiler()
        chosen = [mutation.get(m) for m in args.mutants] if args.mutants else list(mutation.MUTANTS)
    except (ExecutorUnavailable, KeyError) as exc:
        print(f"attnlab mutate: {exc.args[0]}", file=sys.stderr)
        return 2
    outcomes = mutation.run_all(chosen, jobs=args.jobs)
    print(mutation.format_table(outcomes))
    return 0 if all(o.ok for o in outcomes) else 1


def cmd_check(args) -> int:
    if getattr(args, "cpu", False):
        return cmd_check_cpu(args)
    if not _gpu_or_exit("check"):
        return 2
    from .check import CHECK_SEEDS, format_table, run_suite
    from .results import new_record, write_record
    from .shapes import PROBE_SHAPES

    specs = registry.select(args.kernels)
    seeds = CHECK_SEEDS[:1] if args.quick or args.probe else CHECK_SEEDS
    results = run_suite(specs, shapes=PROBE_SHAPES if args.probe else None, seeds=seeds)
    print(format_table(results))
    if args.probe:
        _mark_probed(specs, results)
    if not args.no_record and not args.probe:  # a probe is no check: it never makes a record
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
    if not _gpu_or_exit("bench"):
        return 2
    from .bench import failed_cases, run_bench
    from .results import write_record
    from .shapes import BENCH_SHAPES, QUICK_SWEEP_LENGTHS, SWEEP_LENGTHS, Shape, sweep

    specs = registry.select(args.kernels)
    if args.only_probed:
        folder = _probe_dir()
        if folder is None:
            print("attnlab bench --only-probed: ATTNLAB_SESSION_WORK is not set (a GPU session's stage sets it)",
                  file=sys.stderr)
            return 2
        left_out = [s.id for s in specs if not (folder / s.id).exists()]
        for kid in left_out:
            print(f"not timed: {kid} (it failed, crashed or hung in its probe)", file=sys.stderr)
        specs = [s for s in specs if s.id not in left_out]
        if not specs:
            print("attnlab bench: no kernel came through its probe", file=sys.stderr)
            return 1
    if args.shape:
        shapes = list(dict.fromkeys(Shape(*s) for s in args.shape))
    else:
        shapes = list(dict.fromkeys(BENCH_SHAPES + sweep(QUICK_SWEEP_LENGTHS if args.quick else SWEEP_LENGTHS)))
    record = run_bench(specs, shapes, quick=args.quick)
    failed = failed_cases(record)
    if not args.no_record:
        print(f"record: {write_record(record)}")
    for kid, shape, causal in failed:
        print(f"FAIL {kid} {shape} causal={causal}: wrong output, its time is not a result", file=sys.stderr)
    _print_report(None)
    return 1 if failed else 0


def cmd_sanitize(args) -> int:
    from .sanitize import run_child, sanitize

    if args.child:
        return run_child(args.child)
    if not _gpu_or_exit("sanitize"):
        return 2
    from tqdm.auto import tqdm

    from .results import new_record, write_record

    specs = registry.select(args.kernels)
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
    from . import search
    from .env import has_gpu

    kernels = args.kernels or ["07_mma"]
    shape = _shape(args.shape)
    for kid in kernels:
        search._tunable(kid)  # a clear error for a kernel without knobs
    if args.static or not has_gpu():
        if not args.static:
            print("attnlab search: no CUDA GPU here (torch.cuda.is_available() is False), so nothing is "
                  "measured; the static space follows (--static shows it on a GPU machine too).", file=sys.stderr)
        for kid in kernels:
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
        return 0 if args.static else 2
    from .results import write_record

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
    from .search import best_configs, config_text

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
    from . import profile

    if args.child:
        return profile.run_child(args.child, _shape(args.shape))
    metrics = args.metrics or list(profile.DEFAULT_METRICS)
    if not _gpu_or_exit("profile"):
        print("The command it would run for each kernel:", file=sys.stderr)
        for spec in registry.select(args.kernels):
            print("  " + " ".join(profile.ncu_command(spec.id, metrics, _shape(args.shape), python="python")),
                  file=sys.stderr)
        return 2
    from .results import write_record

    record, failures = profile.run_profile(args.kernels or None, metrics, _shape(args.shape))
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
    from .results import verify

    v = verify()
    for p in v.problems:
        print(f"FAIL {p}", file=sys.stderr)
    for gpu, kid, path in v.fresh:
        print(f"fresh   {kid:<14} {gpu}  ({path})")
    for kid in v.missing:
        print(f"no fresh record: {kid} (awaits a GPU run: python -m attnlab bench {kid})")
    if v.superseded:
        print(f"{v.superseded} older entries of changed kernels are superseded by newer records")
    status = "ok" if v.ok else "FAILED"
    print(f"verify-results {status}: {len(v.fresh)} fresh (GPU, kernel) pairs, "
          f"{len(v.missing)} kernels without a fresh record, {len(v.problems)} problems")
    return 0 if v.ok else 1


def cmd_prebuild(args) -> int:
    """Every cubin a GPU session loads, built here into attnlab's cache (ATTNLAB_CACHE)."""
    from .compile import KernelBuildError
    from .paths import cache_dir
    from .prebuild import prebuild

    try:
        failures = prebuild(args.arch)
    except KernelBuildError as exc:
        print(f"attnlab prebuild: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    cubins = list((cache_dir() / "cubin").glob(f"*-{args.arch}.cubin"))
    print(f"{len(cubins)} cubins for {args.arch} in {cache_dir()}, "
          f"{sum(p.stat().st_size for p in cubins) / 2**20:.1f} MiB")
    return 1 if failures else 0


def cmd_import_evidence(args) -> int:
    from .evidence import main as import_main

    return import_main(args.archives, run_nbval=not args.no_nbval, allow_rehearsal=args.allow_rehearsal)


def _print_report(as_json) -> None:
    from .results import report_rows

    rows = report_rows()
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['gpu']:<26} {r['kernel']:<14} {str(tuple(r['shape'])):<20} causal={str(r['causal']):<5} "
              f"{r['median_us']:9.1f} µs  SDPA {r['sdpa_backend']:<9} {r['sdpa_median_us']:8.1f} µs  "
              f"x{r['speedup_vs_sdpa']:.2f}  check={'pass' if r['check_passed'] else 'FAIL'}")


def cmd_report(args) -> int:
    _print_report(args.json)
    return 0


def main(argv=None) -> int:
    from .static import ARCHES

    p = argparse.ArgumentParser(prog="python -m attnlab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the registered kernels").set_defaults(fn=cmd_list)
    sp = sub.add_parser("inspect", help="static build, resources and SASS mix (no GPU needed)")
    sp.add_argument("kernels", nargs="*", metavar="KERNEL")
    sp.add_argument("--arch", nargs="+", default=list(ARCHES), help="targets, e.g. sm_80 sm_89 sm_90")
    sp.add_argument("--json", action="store_true", help="machine-readable reports")
    sp.set_defaults(fn=cmd_inspect)
    for name, fn, text in (("check", cmd_check, "the correctness suite on a GPU"),
                           ("bench", cmd_bench, "timings next to SDPA on a GPU; writes a record")):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("kernels", nargs="*", metavar="KERNEL")
        sp.add_argument("--quick", action="store_true", help="fewer seeds / shapes / repetitions")
        sp.add_argument("--no-record", action="store_true", help="do not write a record under results/")
        if name == "check":
            sp.add_argument("--cpu", action="store_true",
                            help="run the kernels on the CPU executor (no GPU needed): the pass rule at small "
                                 "shapes, and races, out-of-bounds and other findings; never a timing")
            sp.add_argument("--probe", action="store_true",
                            help="one seed at two shapes, no record: does the kernel run and pass at all (a GPU "
                                 "session probes each kernel in its own process before timing them together)")
        else:
            sp.add_argument("--shape", nargs=4, type=int, action="append", metavar=("B", "H", "L", "D"),
                            help="time at this shape (repeatable) instead of the mission shape and the sweep")
            sp.add_argument("--only-probed", action="store_true",
                            help="time only the kernels `check --probe` passed in this GPU session")
        sp.set_defaults(fn=fn)
    sp = sub.add_parser("mutate", help="plant each listed mistake in a scratch copy of the kernels and show the "
                                       "CPU suite catches it (no GPU needed); exit 1 on a survivor")
    sp.add_argument("mutants", nargs="*", metavar="MUTANT", help="ids from attnlab/mutants.py (default: all)")
    sp.add_argument("--jobs", type=int, default=None, help="mutants run at once (default: up to 4)")
    sp.set_defaults(fn=cmd_mutate)
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
    sp.add_argument("--shape", nargs=4, type=int, metavar=("B", "H", "L", "D"), help="default: the mission shape")
    sp.add_argument("--causal", nargs="+", type=lambda s: s.lower() in ("1", "true", "yes"), default=[False],
                    metavar="BOOL", help="causal flags to search, e.g. --causal false true")
    sp.add_argument("--strategy", choices=["auto", "exhaustive", "evolve"], default="auto")
    sp.add_argument("--budget", type=float, default=300.0, help="seconds per search (no evaluation starts after)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--population", type=int, default=8)
    sp.add_argument("--generations", type=int, default=6)
    sp.add_argument("--reps", type=int, default=30, help="timed CUDA-graph replays per configuration")
    sp.add_argument("--static", action="store_true", help="only the static gate (no GPU needed)")
    sp.add_argument("--arch", default="sm_89", help="target of the static gate (default: the L4's sm_89)")
    sp.add_argument("--json", action="store_true", help="with --static: machine-readable verdicts")
    sp.add_argument("--no-record", action="store_true")
    sp.set_defaults(fn=cmd_search)
    sp = sub.add_parser("tuned", help="the best searched configuration per GPU and shape (fresh records)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_tuned)
    sp = sub.add_parser("profile", help="Nsight Compute metrics of each kernel at the mission shape (GPU); "
                                        "writes a record")
    sp.add_argument("kernels", nargs="*", metavar="KERNEL")
    sp.add_argument("--metrics", nargs="+", help="ncu metric names (default: the appendix's list)")
    sp.add_argument("--shape", nargs=4, type=int, metavar=("B", "H", "L", "D"), help="default: the mission shape")
    sp.add_argument("--no-record", action="store_true")
    sp.add_argument("--child", metavar="KERNEL", help=argparse.SUPPRESS)
    sp.set_defaults(fn=cmd_profile)
    sub.add_parser("verify-results", help="records well formed and fresh (no GPU needed)").set_defaults(fn=cmd_verify)
    sp = sub.add_parser("prebuild", help="build every cubin a GPU session loads into attnlab's cache "
                                         "(ATTNLAB_CACHE), with this machine's nvcc (no GPU needed)")
    sp.add_argument("--arch", default="sm_90", help="the GPU's target (default: sm_90, the H100's and H200's)")
    sp.set_defaults(fn=cmd_prebuild)
    sp = sub.add_parser("import-evidence", help="bring a GPU session's archives into this checkout: records "
                                                "(refused if the kernels changed) and executed notebooks, then "
                                                "verify-results and nbval")
    sp.add_argument("archives", nargs="+", metavar="ARCHIVE", help="<stage>.tar.gz files of attnlab.session")
    sp.add_argument("--no-nbval", action="store_true", help="skip nbval over the imported notebooks")
    sp.add_argument("--allow-rehearsal", action="store_true",
                    help="also take what a rehearsal without a GPU made (scripts/gpu_rehearse.sh's round trip)")
    sp.set_defaults(fn=cmd_import_evidence)
    sp = sub.add_parser("report", help="kernel vs fastest SDPA backend from the freshest records")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_report)
    args = p.parse_args(argv)
    return args.fn(args)
