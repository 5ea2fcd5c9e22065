"""The docs tables derived from the loss declarations (csrc/losses.h), written from the built package.

    python scripts/gen_docs.py          rewrites them in docs/
    python scripts/gen_docs.py --check  exits 1, with a diff, when a committed table differs (the tests run it)

Each generated block sits between two markers in its document, `<!-- generated: NAME -->` and
`<!-- end generated: NAME -->`; the text around them is written by hand. The blocks (BLOCKS):
  docs/semantics.md    the schemas, the divisors of "mean", the backward ops' result shapes and dtypes
  docs/npu_paths.md  "Which chips run which path": one table per op, from each loss's chip paths
"""
from __future__ import annotations

import difflib
import os
import re
import sys
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ("chip", "dtypes", "beta", "log_target", "transform", "api", "fixes", "why")


def _use_in_place_build() -> None:
    """Import this checkout's package when it is built in place (else the installed one)."""
    import glob

    if glob.glob(os.path.join(ROOT, "npu_loss_ops", "_C.*")) and ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def _losses(kind: str | None = None) -> list[dict]:
    """Every loss's declaration (or every one of a kind: "elementwise", "rows")."""
    from npu_loss_ops import _C

    return [d for d in _C._losses() if kind is None or d["kind"] == kind]


def _grouped(rows: list[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """(ops, value) rows with equal values merged, in the order of first appearance."""
    merged: dict[str, list[str]] = {}
    for op, value in rows:
        merged.setdefault(value, []).append(op)
    return [(ops, value) for value, ops in merged.items()]


def _ops_cell(ops: list[str]) -> str:
    return ", ".join(f"`{op}`" for op in ops)


def schemas() -> str:
    """docs/semantics.md, "The ops": every schema, in the declarations' order."""
    lines = [schema for d in _losses() for schema in d["schemas"]]
    return "```\n" + "\n".join(lines) + "\n```\n"


MEAN_COUNT = {
    "self": "`self.numel()`, self as passed",
    "broadcast": "the element count of the broadcast result",
    "self_target_broadcast": "the element count of `broadcast(self, target)`",
}


def mean_divisors() -> str:
    """docs/semantics.md, "Divisors of "mean"": each backward op's divisor, and the forwards'."""
    out = "| op | \"mean\" divides by |\n|---|---|\n"
    for ops, value in _grouped([(d["backward"], MEAN_COUNT[d["mean_count"]]) for d in _losses("elementwise")]):
        out += f"| {_ops_cell(ops)} | {value} |\n"
    return out + "| forwards | the element count of the broadcast result (an empty mean is NaN) |\n"


RESULT_SHAPE = {
    "self": "`broadcast(grad_output, self, target)`",
    "target": "target's shape: the gradient over `broadcast(self, target)` summed over the dims broadcasting "
              "added or expanded; grad_output may not enlarge that broadcast shape",
}
RESULT_DTYPE = {"self": "self's dtype", "target": "target's dtype",
                "promoted": "`at::result_type(grad_output, self, target)`"}


def result_shapes() -> str:
    """docs/semantics.md, "Shapes and dtypes of results": the forwards', then each backward op's."""
    out = ("| op | shape | dtype |\n|---|---|---|\n"
           "| forwards | `broadcast(self, target)` for none, 0-dim otherwise | `at::result_type(self, target)` |\n")
    rows = [(d["backward"], f"{RESULT_SHAPE[d['grad_of']]} | {RESULT_DTYPE[d['grad_dtype']]}")
            for d in _losses("elementwise")]
    for ops, value in _grouped(rows):
        out += f"| {_ops_cell(ops)} | {value} |\n"
    return out


def path_tables() -> str:
    """docs/npu_paths.md, "Which chips run which path": one table per op."""
    from npu_loss_ops import _C

    # The ops that share a table: an out= overload its functional op's, a row loss's forward with gradients its
    # forward's.
    shared = {d["backward"]: f"`.{d['out_overload']}`" for d in _losses("elementwise")}
    shared |= {d["forward"]: f"`{d['with_grads']}`" for d in _losses("rows")}
    blocks: list[str] = []
    op = None
    for row in _C._chip_paths():
        if row["op"] != op:
            op = row["op"]
            suffix = f" (+ {shared[op]})" if op in shared else ""
            blocks.append(f"\n### `{op}`{suffix}\n| chip | dtypes | beta | log_target | transform | runs | fixes | why |\n"
                          "|---|---|---|---|---|---|---|---|\n")
        cells = [row[c] for c in COLUMNS]
        runs = COLUMNS.index("api")
        cells[runs] = cells[runs] if cells[runs] == "composite" else f"`{cells[runs]}`"
        blocks[-1] += "| " + " | ".join(cells).rstrip() + " |\n"
    return "".join(blocks).lstrip("\n")


# document (relative to the repository) -> block name -> the function that writes the block
BLOCKS: dict[str, dict[str, Callable[[], str]]] = {
    "docs/semantics.md": {"schemas": schemas, "mean divisors": mean_divisors, "result shapes": result_shapes},
    "docs/npu_paths.md": {"chip paths": path_tables},
}


def regenerate(doc: str, text: str) -> str:
    """`text` (the document `doc`) with each of its generated blocks written anew."""
    for name, write in BLOCKS[doc].items():
        begin, end = f"<!-- generated: {name} -->\n", f"<!-- end generated: {name} -->"
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if len(pattern.findall(text)) != 1:
            raise SystemExit(f"gen_docs: {doc} must hold the markers of '{name}' once")
        text = pattern.sub(lambda _: begin + write() + end, text)
    return text


def main(argv: list[str]) -> int:
    _use_in_place_build()
    stale = []
    for doc in BLOCKS:
        path = os.path.join(ROOT, doc)
        with open(path) as f:
            committed = f.read()
        generated = regenerate(doc, committed)
        if generated == committed:
            continue
        stale.append(doc)
        if "--check" in argv:
            sys.stdout.writelines(difflib.unified_diff(
                committed.splitlines(True), generated.splitlines(True), f"{doc} (committed)", f"{doc} (generated)"))
        else:
            with open(path, "w") as f:
                f.write(generated)
            print(f"gen_docs: wrote {doc}")
    if stale and "--check" in argv:
        print(f"gen_docs: {', '.join(stale)} differ from the declarations; run python scripts/gen_docs.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
