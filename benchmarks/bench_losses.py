"""Benchmark every npu_loss_ops op against ATen, autograd's composite formulas and the memory-bandwidth roofline.

One run times, for each (threads, dtype, reduction, size), every variant (loss_bench/variants.py lists them:
our ops functional and out=, ATen's ops, the composite formulas autograd runs, F's forward + backward step,
and rooflines: ATen ops with the same read and write streams), interleaved in rounds of
torch.utils.benchmark.Timer.blocked_autorange (loss_bench/timing.py). Reported per call: median with p20/p80
of the timed blocks, effective GB/s (the op's minimal bytes / time), the ratio to the roofline and to the
baseline, and the targets (loss_bench/targets.py) as PASS/MISS.

Writes to --out (default benchmarks/out/, not tracked by git): <name>.csv (metadata in '#' lines and in
columns), <name>.md (the target table), <name>.png (our time against each reference and the targets) and
<name>_bandwidth.png (effective GB/s against size). The figures need matplotlib: scripts/run_benchmarks.sh
installs it and runs this script. --from-csv redraws the table and figures from an existing CSV without
timing anything.

    python benchmarks/bench_losses.py            # 4K..64M elements, float32+bfloat16, 1 and all threads
    python benchmarks/bench_losses.py --quick    # 4K, 256K, 16M, 2 threads, fewer rounds: about two minutes
    python benchmarks/bench_losses.py --sizes 16M --dtypes float32 --threads 2 --ops smooth_l1_loss_backward
    python benchmarks/bench_losses.py --from-csv benchmarks/results/bench_losses.csv --out benchmarks/results
    python benchmarks/bench_losses.py --isa avx2 # on an AVX-512 CPU: ours and ATen both at AVX2
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

from bench_common import ISAS  # noqa: E402  (no torch import: --isa must act before torch's)


def _force_isa_from_argv() -> None:
    """--isa must act before torch and npu_loss_ops are imported: both pick their kernels once, at import."""
    for i, arg in enumerate(sys.argv):
        value = arg.split("=", 1)[1] if arg.startswith("--isa=") else \
            sys.argv[i + 1] if arg == "--isa" and i + 1 < len(sys.argv) else None
        if value in ISAS:
            os.environ["NPU_LOSS_OPS_CPU_ISA"] = value
            os.environ["ATEN_CPU_CAPABILITY"] = ISAS[value]


_force_isa_from_argv()

import torch  # noqa: E402

from bench_common import HERE, REPO, load_average  # noqa: E402
from loss_bench.common import ALL_OPS, DTYPES, FULL_SIZES, QUICK_SIZES, REDUCTIONS, TARGET_THREADS, format_size, \
    parse_size
from loss_bench.figures import write_figures
from loss_bench.report import markdown_targets, print_details, print_targets, read_csv, write_csv
from loss_bench.targets import compare, targets_of
from loss_bench.timing import TimingPlan

DEFAULT_OUT = os.path.join(HERE, "out")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--quick", action="store_true",
                        help=f"sizes {', '.join(map(format_size, QUICK_SIZES))}, {TARGET_THREADS} threads, "
                             "fewer rounds (about two minutes)")
    parser.add_argument("--sizes", type=lambda s: [parse_size(v) for v in s.split(",")],
                        help="comma-separated element counts, e.g. 4K,1M,16M (default 4K..64M, x4)")
    parser.add_argument("--dtypes", type=lambda s: s.split(","), default=["float32", "bfloat16"],
                        help="comma-separated: float32, bfloat16, float16 (default float32,bfloat16)")
    parser.add_argument("--reductions", type=lambda s: s.split(","), default=list(REDUCTIONS),
                        help="comma-separated: none, mean, sum (default all three)")
    parser.add_argument("--ops", type=lambda s: s.split(","), default=ALL_OPS,
                        help=f"comma-separated subset of: {', '.join(ALL_OPS)}")
    parser.add_argument("--threads", type=lambda s: [int(v) for v in s.split(",")],
                        help=f"comma-separated thread counts (default: all ({torch.get_num_threads()}) and 1; "
                             f"--quick: {TARGET_THREADS})")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction,
                        help="also time torch.compile(F, fullgraph=True)'s forward + backward step beside F's (its "
                             "compile time is reported apart, in the CSV's setup_s; default on, off under --isa)")
    parser.add_argument("--autograd", action=argparse.BooleanOptionalAction,
                        help="also time autograd's backward alone for the L1 and KL gradients (informative, no "
                             "target; default on, --quick off)")
    parser.add_argument("--rounds", "--repeats", type=int,
                        help="interleaved rounds per variant, each one blocked_autorange (default 7, --quick 4)")
    parser.add_argument("--min-rounds", "--min-repeats", type=int,
                        help="rounds every variant joins, however slow (default 3)")
    parser.add_argument("--max-variant-s", type=float,
                        help="a variant joins only as many rounds as fit this many seconds per configuration, "
                             "which bounds the slow variants at large sizes (default 1.0, --quick 0.15)")
    parser.add_argument("--round-ms", "--sample-ms", type=float,
                        help="min_run_time of each blocked_autorange, in ms (default 25, --quick 10)")
    parser.add_argument("--check-max", type=parse_size, default=4 << 20,
                        help="check ours against a float64 reference up to this many elements (default 4M; the "
                             "same kernels run above, and the checks cost seconds there)")
    parser.add_argument("--out", "--out-dir", default=DEFAULT_OUT,
                        help=f"directory for the CSV, table and figures (default {os.path.relpath(DEFAULT_OUT, REPO)}, "
                             "not tracked by git)")
    parser.add_argument("--name", help="output file stem (default bench_losses[_quick|_custom]; with --from-csv "
                                       "the CSV's)")
    parser.add_argument("--table", help="where to write the markdown target table (default <out>/<name>.md)")
    parser.add_argument("--isa", choices=list(ISAS),
                        help="run our CPU kernels and ATen's at this instruction set (NPU_LOSS_OPS_CPU_ISA and "
                             "ATEN_CPU_CAPABILITY), e.g. avx2 on an AVX-512 CPU; default: the best the CPU runs")
    parser.add_argument("--from-csv", metavar="PATH",
                        help="time nothing: print the tables and write the table and figures from this CSV")
    args = parser.parse_args()

    for d in args.dtypes:
        if d not in DTYPES:
            parser.error(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    for r in args.reductions:
        if r not in REDUCTIONS:
            parser.error(f"unknown reduction {r!r}; choose from {', '.join(REDUCTIONS)}")
    for op in args.ops:
        if op not in ALL_OPS:
            parser.error(f"unknown op {op!r}; choose from {', '.join(ALL_OPS)}")
    custom = args.sizes is not None or args.ops != ALL_OPS or args.threads is not None
    args.sizes = args.sizes or (QUICK_SIZES if args.quick else FULL_SIZES)
    args.threads = args.threads or ([TARGET_THREADS] if args.quick else sorted({torch.get_num_threads(), 1},
                                                                                reverse=True))
    if args.autograd is None:
        args.autograd = not args.quick
    if args.compile is None:
        # --isa forces ATEN_CPU_CAPABILITY, and with it below the CPU's best, torch 2.13's Inductor computed
        # wrong gradients here (all zeros for F.kl_div's, on an AVX-512 CPU at avx2): its column would mean
        # nothing, so it is left out unless asked for.
        args.compile = "ATEN_CPU_CAPABILITY" not in os.environ
        if not args.compile:
            print("torch.compile(F) not timed: ATEN_CPU_CAPABILITY is forced (--isa); --compile times it anyway",
                  file=sys.stderr)
    if args.from_csv:
        args.name = args.name or os.path.splitext(os.path.basename(args.from_csv))[0]
    else:
        args.name = args.name or "bench_losses" + ("_custom" if custom else "_quick" if args.quick else "")
    return args


def timing_plan(args) -> TimingPlan:
    rounds = args.rounds or (4 if args.quick else 7)
    return TimingPlan(rounds=rounds, min_rounds=min(args.min_rounds or 3, rounds),
                      round_s=(args.round_ms or (10.0 if args.quick else 25.0)) / 1e3,
                      max_variant_s=args.max_variant_s or (0.15 if args.quick else 1.0))


def measure(args) -> tuple[list[dict], dict[str, str]]:
    """Times every configuration; returns the rows and the run metadata."""
    from loss_bench.run import metadata, run  # imports npu_loss_ops, which --from-csv does not need

    plan = timing_plan(args)
    command = "python benchmarks/bench_losses.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    meta = metadata(args, plan, command)
    if float(meta["load_average_1min_start"]) > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {meta['load_average_1min_start']} on {os.cpu_count()} CPUs; "
              "timings will be noisy", file=sys.stderr)
    warnings.filterwarnings("ignore", message="reduction: 'mean' divides the total loss")
    start = time.perf_counter()
    rows = run(args, plan, meta)
    meta["wall_seconds"] = f"{time.perf_counter() - start:.0f}"
    meta["load_average_1min_end"] = f"{load_average():.2f}"
    return rows, meta


def present(values: list[str], rows: list[dict], column: str) -> list[str]:
    """The values of `column` that occur in rows, in the order of `values`."""
    seen = {r[column] for r in rows}
    return [v for v in values if v in seen]


def main() -> int:
    args = parse_args()
    if args.from_csv:
        rows, meta = read_csv(args.from_csv)
        csv_path = args.from_csv
    else:
        rows, meta = measure(args)
        csv_path = None
    if not rows:
        print("no results", file=sys.stderr)
        return 1
    dtypes, reductions = present(list(DTYPES), rows, "dtype"), present(list(REDUCTIONS), rows, "reduction")
    sizes = sorted({r["numel"] for r in rows})

    print(f"npu_loss_ops {meta['npu_loss_ops']} (git {meta['git_sha']}, {meta['cpu_kernel_isa']}), "
          f"torch {meta['torch']} ({meta['cpu_capability']}), {meta['cpu']}, threads {meta['threads']}, "
          f"load {meta['load_average_1min_start']} -> {meta['load_average_1min_end']}"
          + (f", measured {meta['date']}" if args.from_csv else ""))
    print_details(rows, sizes)
    comparisons, threads = compare(rows, dtypes, reductions)
    targets = targets_of(comparisons)
    print_targets(targets, threads, dtypes, reductions)

    os.makedirs(args.out, exist_ok=True)
    written = []
    if csv_path is None:
        csv_path = os.path.join(args.out, args.name + ".csv")
        write_csv(rows, meta, csv_path)
        written.append(csv_path)
    figures = write_figures(rows, comparisons, dtypes, meta, threads, os.path.join(args.out, args.name))
    written += figures
    table = args.table or os.path.join(args.out, args.name + ".md")
    if targets:
        with open(table, "w") as f:
            f.write(markdown_targets(targets, threads, dtypes, reductions, meta, os.path.relpath(csv_path, REPO),
                                     [os.path.relpath(p, REPO) for p in figures], rows))
        written.append(table)
    took = "" if args.from_csv else f" (benchmark took {meta['wall_seconds']} s)"
    print(f"\nwrote {', '.join(os.path.relpath(p) for p in written)}{took}")
    bad = [f"{r['op']} {r['variant']} {r['dtype']} {r['reduction']} {format_size(r['numel'])}"
           for r in rows if r["matches_reference"] is False]
    if bad:
        print("results that differ from the reference:\n  " + "\n  ".join(bad), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
