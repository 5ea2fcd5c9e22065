"""The docs tables derived from the loss declarations (csrc/losses.h), written from the built package.

    python scripts/gen_docs.py          rewrites them in docs/
    python scripts/gen_docs.py --check  exits 1, with a diff, when a committed table differs (the tests run it)

Today: docs/npu_routing.md, "Which chips run which path": one table per op, from each loss's chip paths.
"""
from __future__ import annotations

import difflib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUTING_DOC = os.path.join(ROOT, "docs", "npu_routing.md")
SECTION = "\n## Which chips run which path\n"
COLUMNS = ("chip", "dtypes", "beta", "log_target", "api", "fixes", "why")


def _use_in_place_build() -> None:
    """Import this checkout's package when it is built in place (else the installed one)."""
    import glob

    if glob.glob(os.path.join(ROOT, "npu_loss_ops", "_C.*")) and ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def routing_tables() -> str:
    """The tables of docs/npu_routing.md's "Which chips run which path", as markdown."""
    from npu_loss_ops import _C

    out_overload = {d["backward"]: d["out_overload"] for d in _C._losses()}
    blocks: list[str] = []
    op = None
    for row in _C._npu_routing_table():
        if row["op"] != op:
            op = row["op"]
            suffix = f" (+ `.{out_overload[op]}`)" if op in out_overload else ""
            blocks.append(f"\n### `{op}`{suffix}\n| chip | dtypes | beta | log_target | runs | fixes | why |\n"
                          "|---|---|---|---|---|---|---|\n")
        cells = [row[c] for c in COLUMNS]
        cells[4] = cells[4] if cells[4] == "composite" else f"`{cells[4]}`"
        blocks[-1] += "| " + " | ".join(cells).rstrip() + " |\n"
    return "".join(blocks)


def routing_doc(text: str) -> str:
    """`text` (docs/npu_routing.md) with its tables replaced by routing_tables()."""
    head, rest = text.split(SECTION, 1)
    body, _, tail = rest.partition("\n## ")
    prose = body.split("\n### ", 1)[0].rstrip("\n") + "\n"
    return head + SECTION + prose + routing_tables() + ("\n## " + tail if tail else "")


def main(argv: list[str]) -> int:
    _use_in_place_build()
    with open(ROUTING_DOC) as f:
        committed = f.read()
    generated = routing_doc(committed)
    if "--check" in argv:
        if generated != committed:
            sys.stdout.writelines(difflib.unified_diff(
                committed.splitlines(True), generated.splitlines(True), "docs/npu_routing.md (committed)",
                "docs/npu_routing.md (generated)"))
            print("gen_docs: docs/npu_routing.md differs from the declarations; run python scripts/gen_docs.py")
            return 1
        return 0
    if generated != committed:
        with open(ROUTING_DOC, "w") as f:
            f.write(generated)
        print("gen_docs: wrote docs/npu_routing.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
