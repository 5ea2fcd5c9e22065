"""The results as text: the CSV (written, and read back for --from-csv), the console tables and the markdown
target table."""
from __future__ import annotations

import csv

from .common import DTYPE_SHORT, SMALL_SIZE, TARGET_SIZE, format_size
from .targets import Comparison

# CSV columns that hold numbers; the rest are text. Empty cells stay "" (not measured, or no reference).
INT_COLUMNS = ("numel", "threads", "samples", "calls_per_sample", "streams")
FLOAT_COLUMNS = ("median_ms", "p20_ms", "p80_ms", "GBps", "roofline_ms", "ratio_to_roofline", "baseline_ms",
                 "ratio_to_baseline", "ratio_to_autograd", "setup_s", "cpu_per_wall")


def write_csv(rows: list[dict], meta: dict[str, str], path: str) -> None:
    """The run metadata as '# key: value' lines, then one row per (configuration, variant)."""
    with open(path, "w", newline="") as f:
        for key, value in meta.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in row.items()})


def read_csv(path: str) -> tuple[list[dict], dict[str, str]]:
    """The rows and metadata of a CSV that write_csv wrote, with the numbers and booleans it wrote."""
    meta: dict[str, str] = {}
    with open(path, newline="") as f:
        lines = []
        for line in f:
            if line.startswith("#"):
                key, _, value = line[1:].strip().partition(":")
                meta[key.strip()] = value.strip()
            else:
                lines.append(line)
    rows = []
    for row in csv.DictReader(lines):
        for key in INT_COLUMNS:
            row[key] = int(row[key])
        for key in FLOAT_COLUMNS:
            row[key] = float(row[key]) if row.get(key, "") != "" else ""  # setup_s: absent from older CSVs
        row["matches_reference"] = {"True": True, "False": False}.get(row["matches_reference"], "")
        row["disturbed"] = row.get("disturbed") == "True"  # absent from CSVs older than the column
        rows.append(row)
    return rows, meta


def print_details(rows: list[dict], sizes: list[int]) -> None:
    """A compact per-op table at the target sizes: median ms of each variant and the two ratios of ours."""
    show = [s for s in (SMALL_SIZE, TARGET_SIZE) if s in sizes] or sizes[-1:]
    print("\nmedian ms per call [p20, p80]; ours/roof and ours/base are median time ratios")
    header = (f"{'op':<30} {'variant':<14} {'dtype':<5} {'red':<4} {'n':>4} {'th':>2} {'median [p20, p80]':>28} "
              f"{'GB/s':>6} {'/roof':>6} {'/base':>6}")
    print(header)
    print("-" * len(header))

    def fmt(v):
        return f"{v:6.2f}" if isinstance(v, float) else f"{'':6}"

    for row in rows:
        if row["numel"] not in show:
            continue
        print(f"{row['op']:<30} {row['variant']:<14} {DTYPE_SHORT[row['dtype']]:<5} {row['reduction']:<4} "
              f"{format_size(row['numel']):>4} {row['threads']:>2} "
              f"{row['median_ms']:>9.4f} [{row['p20_ms']:>7.4f}, {row['p80_ms']:>7.4f}] "
              f"{row['GBps']:6.1f} {fmt(row['ratio_to_roofline'])} {fmt(row['ratio_to_baseline'])}"
              + ("" if row["matches_reference"] in ("", True) else "  DIFFERS FROM THE REFERENCE"))


def format_cell(tg: Comparison, value: float | None, markdown: bool, unreliable: bool = False) -> str:
    """A target cell: '-' when not measured; a disturbed cell is marked '?' and judged neither way; a miss is
    bold (markdown) or marked with '!' (console)."""
    if value is None:
        return "–" if markdown else "-"
    text = f"{value:.2f}"
    if unreliable:
        return f"{text}?"
    if not tg.meets(value):
        text = f"**{text}**" if markdown else f"{text}!"
    return text


def target_columns(dtypes: list[str], reductions: list[str]) -> list[tuple[str, str]]:
    return [(d, red) for d in dtypes for red in reductions]


def limit_text(tg: Comparison, markdown: bool) -> str:
    if markdown:
        return f"{'≥' if tg.speedup else '≤'} {tg.limit:g}{'×' if tg.speedup else ''}"
    return f"{'>=' if tg.speedup else '<='}{tg.limit:g}{'x' if tg.speedup else ''}"


def summary(targets: list[Comparison]) -> str:
    counts = {r: sum(tg.result == r for tg in targets) for r in ("PASS", "MISS", "UNRELIABLE")}
    text = f"{counts['PASS']}/{len(targets)} target rows pass, {counts['MISS']} miss"
    return text + (f", {counts['UNRELIABLE']} unreliable (disturbed cells, no miss)" if counts["UNRELIABLE"] else "")


def print_targets(targets: list[Comparison], threads: int | None, dtypes: list[str], reductions: list[str]) -> None:
    if not targets:
        print("\n(no target configuration in this run: the targets need 4K and/or 16M elements)")
        return
    cols = target_columns(dtypes, reductions)
    print(f"\nTargets ({threads} threads): time ratios ours/reference (<= limit) or speedups reference/ours "
          "(>= limit); '!' marks a cell that misses, '?' a disturbed one (another process took the CPU: not judged)")
    header = f"{'op':<34}" + "".join(f"{DTYPE_SHORT[d] + ' ' + red:>10}" for d, red in cols) + f"{'limit':>8}  result"
    group = None
    for tg in targets:
        if tg.group != group:
            group = tg.group
            print(f"\n{group}")
            print(header)
            print("-" * len(header))
        print(f"{tg.label:<34}"
              + "".join(f"{format_cell(tg, tg.cells.get(c), False, tg.unreliable.get(c, False)):>10}" for c in cols)
              + f"{limit_text(tg, False):>8}  {tg.result}")
    print("\n" + summary(targets))


def compile_note(rows: list[dict]) -> str:
    """The compile times of the torch.compile(F) steps (not timed), as one sentence, or nothing."""
    seconds = [r["setup_s"] for r in rows if r["variant"] == "compiled" and r["setup_s"] != ""]
    if not seconds:
        return ""
    return (f" `torch.compile(F, fullgraph=True)` steps were compiled before the timing: "
            f"{min(seconds):.1f}-{max(seconds):.1f} s per loss and configuration (forward and backward).")


def markdown_targets(targets: list[Comparison], threads: int | None, dtypes: list[str], reductions: list[str],
                     meta: dict[str, str], csv_rel: str, figures_rel: list[str], rows: list[dict]) -> str:
    cols = target_columns(dtypes, reductions)
    figures = ", ".join(f"`{p}`" for p in figures_rel) or "none (matplotlib is not installed)"
    lines = [
        f"Measured with `{meta['command']}` ({meta['wall_seconds']} s): npu_loss_ops {meta['npu_loss_ops']} "
        f"(git {meta['git_sha']}, CPU kernels {meta['cpu_kernel_isa']}), torch {meta['torch']} "
        f"(CPU capability {meta['cpu_capability']}), {meta['cpu']}, {meta['logical_cpus']} logical CPUs, "
        f"targets at {threads} threads, 1-minute load average {meta['load_average_1min_start']} at the start and "
        f"{meta['load_average_1min_end']} at the end, "
        f"{meta['date'][:10]}. Full results: `{csv_rel}`, figures: {figures}.",
        "",
        "Time ratios ours/reference (target: at most the limit) or speedups reference/ours (target: at least the "
        "limit), median per call; a bold cell misses; a cell marked ? was disturbed (the process got less CPU time than "
        "its threads need while it or its reference was timed: another process ran) and is judged neither way. Backward 'mean'/'sum' take a 0-dim gradient, as autograd "
        "passes it. Composite formulas: L1 `torch.sgn(x - t) * g`, KL `g * (torch.log(t) + 1 - x)`, KL log-target "
        "`g * torch.exp(t) * (t + 1 - x)` ('mean': then `.div_(n)`). Rooflines: `aten.addcmul` (3 reads + 1 "
        "write, backward 'none') and `aten.add` (2 reads + 1 write, backward 'mean'/'sum')." + compile_note(rows),
        "",
        "| target | op | " + " | ".join(f"{DTYPE_SHORT[d]} {red}" for d, red in cols) + " | limit | result |",
        "|---|---|" + "---:|" * len(cols) + "---:|---|",
    ]
    for tg in targets:
        lines.append(f"| {tg.group} | `{tg.label}` | "
                     + " | ".join(format_cell(tg, tg.cells.get(c), True, tg.unreliable.get(c, False)) for c in cols)
                     + f" | {limit_text(tg, True)} | {tg.result} |")
    lines += ["", summary(targets) + "."]
    return "\n".join(lines) + "\n"
