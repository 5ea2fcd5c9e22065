"""The pieces of benchmarks/bench_losses.py, which is the command line that puts them together.

    common.py     what is measured: dtypes, reductions, sizes, the ops and their baselines, one configuration
    variants.py   the timed callables of one configuration and the correctness check of each of ours
    timing.py     interleaved rounds of torch.utils.benchmark.Timer.blocked_autorange per variant
    progress.py   one step per configuration: a tqdm bar on a terminal, one plain line per step in a log
    run.py        the run: every configuration in turn, timed and checked, into CSV rows; the run metadata
    targets.py    time ratios of ours to each reference, and the targets they are held to (PASS/MISS)
    report.py     the CSV (written, and read back for --from-csv), the console tables, the markdown table
    figures.py    the PNGs: ratios against the targets (main figure), effective GB/s against size
"""
