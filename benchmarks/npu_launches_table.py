"""The rows of benchmarks/npu_launches.py's table (the losses', the generalized JSD's and the fused linear
JSD's cases and their keys), and the table itself: its markdown (benchmarks/results/npu_launches.md) and the
check of a family's measured counts against the committed JSON."""
from __future__ import annotations

import json
import os
import sys

LOSSES = ("smooth_l1_loss", "huber_loss", "mse_loss", "l1_loss", "kl_div", "kl_div[log]")
DTYPES = ("float32", "float16", "bfloat16")
REDUCTIONS = {"kl_div": ("none", "mean", "sum", "batchmean")}
FAMILY_ORDER = ("910B", "910_93", "950", "910", "310P", "310B")


def cases():
    for loss in LOSSES:
        for dtype in DTYPES:
            for reduction in REDUCTIONS.get(loss.split("[")[0], ("none", "mean", "sum")):
                yield loss, dtype, reduction


def key(loss: str, dtype: str, reduction: str) -> str:
    return f"{loss} {dtype} {reduction}"


# The generalized JSD: op x dtype x beta x rows, 'sum', V = JSD_VOCAB, labels dropping every fourth row.
JSD_OPS = ("forward", "forward with gradients", "backward")
JSD_VOCAB = 512


def jsd_cases():
    for op in JSD_OPS:
        for dtype in ("float32", "bfloat16"):
            for beta in (0.0, 0.5, 1.0):
                for rows in (1024, 4096):
                    yield op, dtype, beta, rows


def jsd_key(op: str, dtype: str, beta: float, rows: int) -> str:
    return f"generalized_jsd {op} {dtype} beta={beta:g} N={rows}"


# The sparse JSD (a served teacher's top-K): op x dtype x beta x rows, 'sum', V = JSD_VOCAB, K = SPARSE_K with the
# tail, a repeat masked in each row, labels dropping every fourth row.
SPARSE_K = 8


def sparse_cases():
    for op in JSD_OPS:
        for dtype in ("float32", "bfloat16"):
            for beta in (0.0, 0.5):
                for rows in (1024, 4096):
                    yield op, dtype, beta, rows


def sparse_key(op: str, dtype: str, beta: float, rows: int) -> str:
    return f"sparse_jsd {op} {dtype} beta={beta:g} N={rows}"


# The fused linear JSD: dtype x hard loss x rows, 'batchmean', V = JSD_VOCAB, H = 64 (the teacher's 128),
# chunks of FUSED_CHUNK rows, the student's and the teacher's gradients; one forward and its backward.
FUSED_CHUNK = 256


def fused_cases():
    for dtype in ("float32", "bfloat16"):
        for hard in (0.0, 0.5):
            for rows in (1024, 4096):
                yield dtype, hard, rows


def fused_key(dtype: str, hard: float, rows: int) -> str:
    return f"fused_linear_jsd {dtype} weight_hard_loss={hard:g} N={rows}"


# ---- the table ----

def family_of(soc: str) -> str:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "npu_emulator"))
    import emulator

    return next((f for f, s in emulator.SOCS.items() if s == soc), soc)


def cell(side: dict, phase: str) -> str:
    text = str(side[phase]) if phase in side else "–"
    if side.get("host"):
        text += " + host"
    return text


def why(ours: dict) -> str:
    """The operators behind a count above one launch per phase: the loss kernel's fixes or the composite."""
    parts = []
    for phase in ("fwd", "bwd"):
        ops = ours.get(f"{phase}_ops", {})
        if sum(ops.values()) > 1:
            parts.append(f"{phase}: " + ", ".join(f"{k.removeprefix('aclnn')} {v}" for k, v in sorted(ops.items())))
    return "; ".join(parts) or "–"


def jsd_cell(side: dict) -> tuple[str, str, str]:
    """(launches, chunks, launches per chunk) of a JSD call, or its note."""
    if "note" in side:
        return side["note"], "", ""
    if not side["chunks"]:
        return str(side["launches"]), "–", "–"
    per = f"{side['launches'] / side['chunks']:.1f}" if side["chunks"] else "–"
    return str(side["launches"]), str(side["chunks"]), per


def jsd_markdown(results: dict) -> list[str]:
    lines = [
        "## The generalized JSD",
        "",
        "One call of each op (`_generalized_jsd_loss_and_grads` and `generalized_jsd_loss_backward` with both "
        f"gradients), 'sum', N rows of V = {JSD_VOCAB:,}, labels dropping every fourth row, temperature 1. Ours: "
        "the op as registered (the aclnn path where the chip's row names an API, "
        "[docs/npu_paths.md](../../docs/npu_paths.md)); composite: the chunked composite's kernel of the same op on "
        "the same chip. A chunk is a block of rows (two log-softmaxes): ours hold at most 8 float32 rows of V "
        "per row of a chunk, the composite 20, each within an eighth of one N x V tensor of the logits, so the "
        "chunk count does not grow with N (below the 256 MiB cap). TRL: TRL 1.16's function as "
        "`tests/reference.py` restates it line by line (checked against TRL's own on the CPU), through torch_npu's "
        "own kernels (`LogSumExp`, `Stack`, `Index` and `Nonzero` among them, all emulated), without chunks: its "
        "'forward with gradients' is the forward and `backward()`, its 'backward' the `backward()` alone; the "
        "column 'ours / TRL' is the ratio of launches.",
        "",
    ]
    header = [_ROW_COLUMNS + " TRL | ours / TRL |", _ROW_ALIGN + "---:|---:|"]
    for _, row, case in _family_rows(results, "jsd_rows", "generalized JSD", header, lines,
                                     [(jsd_key(*c), c) for c in jsd_cases()]):
        trl = row.get("TRL", {"note": "not measured"})
        trl_cell = trl["note"] if "note" in trl else str(trl["launches"])
        ratio = (f"{row['ours']['launches'] / trl['launches']:.2f}x"
                 if "launches" in trl and "launches" in row["ours"] and trl["launches"] else "–")
        lines.append(f"{_row_cells(case, row)} {trl_cell} | {ratio} |")
    return lines


# A row member's table: the case, then ours' and the composite's launches, chunks and launches per chunk.
_ROW_COLUMNS = ("| op | dtype | beta | N | ours | ours' chunks | ours per chunk | composite | composite's chunks "
                "| composite per chunk |")
_ROW_ALIGN = "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"


def _row_cells(case: tuple, row: dict) -> str:
    op, dtype, beta, n = case
    ours, comp = jsd_cell(row["ours"]), jsd_cell(row.get("composite", {"note": "not measured"}))
    return f"| {op} | {dtype} | {beta:g} | {n:,} | {' | '.join(ours)} | {' | '.join(comp)} |"


def sparse_markdown(results: dict) -> list[str]:
    lines = [
        "## The sparse JSD",
        "",
        "One call of each op of `sparse_jsd_loss` (the forward with both gradients, the backward with both), 'sum', "
        f"N rows of V = {JSD_VOCAB:,}, a support of K = {SPARSE_K} with the tail (one repeat masked per row), labels "
        "dropping every fourth row, temperature 1. Ours: the op as registered (the aclnn path on the chips whose row "
        "names an API: 910B and 910_93, [docs/npu_paths.md](../../docs/npu_paths.md)); composite: the chunked "
        "composite's kernel of the same op on the same chip. A chunk here is counted by its student log-softmax. "
        "The support's (N, K) terms are torch_npu's ops in both.",
        "",
    ]
    for _, row, case in _family_rows(results, "sparse_rows", "sparse JSD", [_ROW_COLUMNS, _ROW_ALIGN], lines,
                                     [(sparse_key(*c), c) for c in sparse_cases()]):
        lines.append(_row_cells(case, row))
    return lines


def fused_markdown(results: dict) -> list[str]:
    lines = [
        "## The fused linear JSD",
        "",
        f"One call of `fused_linear_jsd_loss` and its backward, 'batchmean', N rows of hidden size 64 (the teacher's "
        f"128), V = {JSD_VOCAB:,}, labels dropping every fourth row, chunks of {FUSED_CHUNK} rows, both models' "
        "gradients. Per chunk: the two logits' matmuls, the generalized JSD's forward with gradients (its row in "
        "[docs/npu_paths.md](../../docs/npu_paths.md)), the cross entropy's terms where its weight is not 0, and "
        "the gradients' matmuls; the backward scales the six gradients.",
        "",
    ]
    header = ["| dtype | weight_hard_loss | N | launches | chunks | per chunk |", "|---|---:|---:|---:|---:|---:|"]
    for _, row, (dtype, hard, n) in _family_rows(results, "fused_rows", "fused linear JSD", header, lines,
                                                  [(fused_key(*c), c) for c in fused_cases()]):
        launches, chunks, per = jsd_cell(row["ours"])
        lines.append(f"| {dtype} | {hard:g} | {n:,} | {launches} | {chunks} | {per} |")
    return lines


def _family_rows(results: dict, table: str, title: str, header: list[str], lines: list[str], keyed: list):
    """Per family in FAMILY_ORDER with rows in `table`: appends its heading and `header` to `lines`, yields
    (family, row, case) for each case measured there, and ends the family's table with a blank line."""
    for family in sorted(results, key=lambda f: FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 99):
        rows = results[family].get(table, {})
        if not rows:
            continue
        lines += [f"### {family} ({results[family]['soc']}): {title}", "", *header]
        for name, case in keyed:
            if name in rows:
                yield family, rows[name], case
        lines.append("")


def markdown(results: dict) -> str:
    lines = [
        "aclnn launches per call on the emulated CANN (`benchmarks/npu_launches.py`, run by "
        "`scripts/run_npu_emulated.sh`): one forward call and one `backward()` of a (4, 256) input, counted "
        "apart; KL with both input and target requiring grad. Ours: `npu_loss_ops.<loss>`; F: "
        "`torch.nn.functional.<loss>` with routing off, i.e. torch_npu's own kernels. The last column lists the "
        "operators of a phase that launches more than one kernel (the fixes and composites of "
        "[docs/npu_paths.md](../../docs/npu_paths.md) say which chip quirk each answers). \"+ host\": torch_npu "
        "has no NPU kernel for some of F's ATen ops (below each family's table) and runs them on the host "
        "through its CPU fallback, copying the tensors there and back; those do not appear as launches.",
        "",
    ]
    for family in sorted(results, key=lambda f: FAMILY_ORDER.index(f) if f in FAMILY_ORDER else 99):
        rows = results[family]["rows"]
        lines += [f"### {family} ({results[family]['soc']})", "",
                  "| loss | dtype | reduction | ours fwd | ours bwd | F fwd | F bwd | ours' operators where more than one |",
                  "|---|---|---|---:|---:|---:|---:|---|"]
        for loss, dtype, reduction in cases():
            row = rows.get(key(loss, dtype, reduction))
            if row is None:
                continue
            ours, theirs = row["ours"], row["F"]
            f_fwd, f_bwd = (cell(theirs, "fwd"), cell(theirs, "bwd")) if "note" not in theirs else (theirs["note"], "")
            o_fwd, o_bwd = (cell(ours, "fwd"), cell(ours, "bwd")) if "note" not in ours else (ours["note"], "")
            lines.append(f"| {loss} | {dtype} | {reduction} | {o_fwd} | {o_bwd} | {f_fwd} | {f_bwd} | {why(ours)} |")
        on_host = sorted({op for row in rows.values() for op in row["F"].get("host", ())})
        lines.append("")
        if on_host:
            lines += [f"On the host through torch_npu's CPU fallback: {', '.join(f'`{op}`' for op in on_host)}.", ""]
    return "\n".join(lines + jsd_markdown(results) + sparse_markdown(results) + fused_markdown(results))


def check(measured: dict, committed_path: str) -> list[str]:
    """Rows where ours launches more than the committed table (or fails where it did not)."""
    with open(committed_path) as f:
        committed = json.load(f)
    family = family_of(measured["soc"])
    if family not in committed:
        return [f"{family}: not in {committed_path}"]
    worse = []
    for name, row in measured["rows"].items():
        was = committed[family]["rows"].get(name, {}).get("ours")
        now = row["ours"]
        if was is None:
            worse.append(f"{family} {name}: not in the committed table")
            continue
        for phase in ("fwd", "bwd"):
            if phase in was and (phase not in now or now[phase] > was[phase]):
                worse.append(f"{family} {name} {phase}: {now.get(phase, now.get('note'))} launches, "
                             f"the committed table has {was[phase]} ({now.get(phase + '_ops')})")
    for name, row in [*measured.get("jsd_rows", {}).items(), *measured.get("sparse_rows", {}).items(),
                      *measured.get("fused_rows", {}).items()]:
        table = ("fused_rows" if name.startswith("fused_linear_jsd") else
                 "sparse_rows" if name.startswith("sparse_jsd") else "jsd_rows")
        was = committed[family].get(table, {}).get(name, {}).get("ours")
        now = row["ours"]
        if was is None:
            worse.append(f"{family} {name}: not in the committed table")
        elif "launches" in was and now.get("launches", float("inf")) > was["launches"]:
            worse.append(f"{family} {name}: {now.get('launches', now.get('note'))} launches, the committed table "
                         f"has {was['launches']} ({now.get('ops')})")
    return worse
