"""aclnn launches per call on the emulated NPU: TRL 1.16's chunked divergence loss against the package's drop-in.

TRL 1.16's `trl.trainer.distillation_trainer._chunked_divergence_loss` (on a device without Triton its torch path:
tiles of TOKEN_CHUNK_SIZE = 4,096 tokens x VOCAB_CHUNK_SIZE = 32,768 vocabulary, two passes over them, three where
0 < beta < 1, and one in the backward) against `npu_loss_ops.trl.chunked_divergence_loss` (the same signature, on
`fused_linear_jsd_loss`), at issue 52's sizes: N 2,048 and 8,192 tokens, V 32,768 and 151,936, the student's H
1,024 and 2,048 (the teacher's twice that), beta 0.5 and 0, float32 and bfloat16. One call is the forward and
`loss.backward()`, counted apart from the emulator's trace (tests/npu_emulator/emulator.py: every aclnn operator
whose run phase executed), on device "npu" over the emulated CANN; every fourth position is masked out.

The emulated kernels run on the host, so the real sizes take minutes each. A case is "measured" at its real
N, V and H; the others are "derived": both functions on smaller tensors with the same tiles and chunks, which
give the real size's counts because neither function's count depends on what is scaled down.
- TRL: its two tile sizes divided by SCALE (module globals its forward and backward read at each call), on
  N / SCALE tokens and V / SCALE vocabulary: the same token tiles and vocabulary tiles, the last one partial
  as at the real V (151,936 = 4 x 32,768 + 20,864); one launch per operator whatever a tile's shape.
- The package: the real N (its chunk's rows are a fixed share of N, V cancels out of its budget) on V / SCALE
  and H = 64 (the teacher's 128): the same chunks, one launch per operator whatever their shape.
The measured cells check the derivation: `--derive-measured` also derives them, and the table shows both.

    .venv-trl-npu/bin/python benchmarks/npu_launches_trl.py --emulator build/npu_emulator \\
        --json OUT.json [--markdown benchmarks/results/npu_launches.md] [--measure 2048,32768,1024 ...] [--check]
        run it with a Python that imports trl 1.16 and torch_npu (scripts/trl_stage.sh with
        TRL_BASE_VENV=.venv-npu); every case runs in a fresh emulated process (`--family`, default 910B).
        --measure N,V,H: the sizes measured at their real shape (the rest derived); --markdown writes the table
        into its section of that file; --check fails (exit 1) if the package launches more than TRL in any
        measured case.
    python benchmarks/npu_launches_trl.py --from-json OUT.json --markdown benchmarks/results/npu_launches.md [--check]
        (anywhere) the table again from a run's JSON
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TOKENS = (2048, 8192)
VOCABS = (32768, 151936)
HIDDEN = (1024, 2048)  # the student's; the teacher's is twice it
BETAS = (0.5, 0.0)
DTYPES = ("float32", "bfloat16")
SCALE = 64  # derived cases: TRL's tiles and both vocabularies divided by it
DERIVED_HIDDEN = 64
SECTION = "## TRL's chunked divergence loss against the package's"


def cases():
    for n in TOKENS:
        for v in VOCABS:
            for h in HIDDEN:
                for beta in BETAS:
                    for dtype in DTYPES:
                        yield n, v, h, beta, dtype


def case_key(n: int, v: int, h: int, beta: float, dtype: str) -> str:
    return f"N={n} V={v} H={h} beta={beta:g} {dtype}"


# ---- one case, in an emulated process -----------------------------------------------------------------------


def worker(spec: dict) -> dict:
    """Counts of one function on one case: {fwd, bwd, fwd_ops, bwd_ops, loss, seconds} or {note}."""
    sys.path.insert(0, os.path.join(REPO, "tests", "npu_emulator"))
    import emulator
    import torch

    emulator.import_torch_npu()
    if not emulator.active():
        sys.exit("npu_launches_trl.py: not on the emulated CANN")
    emulator.pin_jit_compile_off()
    import npu_loss_ops.trl
    from trl.kernels import chunked_divergence
    from trl.trainer.distillation_trainer import _chunked_divergence_loss

    n, v, h, beta, dtype = spec["n"], spec["v"], spec["h"], spec["beta"], spec["dtype"]
    if spec["function"] == "trl":
        fn = _chunked_divergence_loss
        if spec["scale"] > 1:
            chunked_divergence.TOKEN_CHUNK_SIZE //= spec["scale"]
            chunked_divergence.VOCAB_CHUNK_SIZE //= spec["scale"]
    else:
        fn = npu_loss_ops.trl.chunked_divergence_loss
    gen = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    hs = torch.randn(1, n, h, generator=gen).div(4)
    ht = torch.randn(1, n, 2 * h, generator=gen).div(4)
    ws = torch.randn(v, h, generator=gen).div(h ** 0.5)
    wt = torch.randn(v, 2 * h, generator=gen).div((2 * h) ** 0.5)
    mask = torch.ones(1, n, dtype=torch.long)
    mask[:, ::4] = 0
    hs, ws = (t.to("npu", dt).requires_grad_() for t in (hs, ws))
    ht, wt, mask = ht.to("npu", dt), wt.to("npu", dt), mask.to("npu")

    def counted(trace: dict) -> tuple[int, dict, list]:
        ops = {k: c for k, c in trace.items() if k.startswith("aclnn") and ":" not in k}
        bad = sorted(k for k in trace if k.startswith("aclop:") or "GetWorkspaceSize:" in k)
        return sum(ops.values()), ops, bad

    import trl

    out: dict = {"tiles": [chunked_divergence.TOKEN_CHUNK_SIZE, chunked_divergence.VOCAB_CHUNK_SIZE],
                 "trl": trl.__version__, "package": os.path.dirname(npu_loss_ops.trl.__file__)}
    t0 = time.perf_counter()
    try:
        torch.npu.synchronize()
        emulator.trace_reset()
        loss, _, _ = fn(hs, ht, ws, wt, mask, beta)
        out["fwd"], out["fwd_ops"], bad_fwd = counted(emulator.trace())
        emulator.trace_reset()
        loss.backward()
        out["bwd"], out["bwd_ops"], bad_bwd = counted(emulator.trace())
        out["loss"] = loss.item()
    except Exception as e:  # noqa: BLE001  (the cell says what failed)
        return {"note": f"fails on the emulator: {type(e).__name__}: {str(e).splitlines()[0][:120]}"}
    if bad_fwd or bad_bwd:
        return {"note": f"the emulator lacks what this call needs ({', '.join(bad_fwd + bad_bwd)})"}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


# ---- the cases, each in its own emulated process ------------------------------------------------------------


def run_case(args, function: str, n: int, v: int, h: int, beta: float, dtype: str, scale: int) -> dict:
    sys.path.insert(0, os.path.join(REPO, "tests", "npu_emulator"))
    import emulator

    spec = {"function": function, "n": n, "v": v, "h": h, "beta": beta, "dtype": dtype, "scale": scale}
    env = emulator.env(args.family, args.emulator)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)], env=env,
                          cwd="/", capture_output=True, text=True, stdin=subprocess.DEVNULL)  # the installed package
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {"note": f"the emulated process failed (exit {proc.returncode}): {tail}"}
    return {**json.loads(lines[-1]), "shape": [n, v, h]}


def derived(args, n: int, v: int, beta: float, dtype: str) -> dict:
    """Both functions on the smaller shapes of the same tiles and chunks (the module docstring)."""
    return {"TRL": run_case(args, "trl", n // SCALE, v // SCALE, DERIVED_HIDDEN, beta, dtype, SCALE),
            "ours": run_case(args, "ours", n, v // SCALE, DERIVED_HIDDEN, beta, dtype, 1)}


def measure(args) -> dict:
    real = {tuple(int(x) for x in s.split(",")) for s in args.measure}
    rows: dict = {}
    for n, v, h, beta, dtype in cases():
        key = case_key(n, v, h, beta, dtype)
        row: dict = {}
        if (n, v, h) in real:
            row["measured"] = {"TRL": run_case(args, "trl", n, v, h, beta, dtype, 1),
                               "ours": run_case(args, "ours", n, v, h, beta, dtype, 1)}
        if (n, v, h) not in real or args.derive_measured:
            # H does not enter either count: one derived run serves both hidden sizes.
            twin = case_key(n, v, HIDDEN[0], beta, dtype)
            row["derived"] = rows.get(twin, {}).get("derived") or derived(args, n, v, beta, dtype)
        rows[key] = row
        print(f"{key}: " + "; ".join(f"{kind} TRL {total(r['TRL'])} ours {total(r['ours'])}"
                                     for kind, r in row.items()), flush=True)
    revision = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    # What the workers imported (from outside the checkout: the installed package).
    sides = [side for row in rows.values() for kind in row.values() for side in kind.values() if "trl" in side]
    return {"soc": args.family, "date": datetime.date.today().isoformat(), "revision": revision,
            "trl": sides[0]["trl"] if sides else "?", "package": sides[0]["package"] if sides else "?",
            "scale": SCALE,
            "command": " ".join(["python", "benchmarks/npu_launches_trl.py", *sys.argv[1:]]), "rows": rows}


# ---- the table --------------------------------------------------------------------------------------------------


def total(side: dict):
    return side["fwd"] + side["bwd"] if "fwd" in side else None


def best(row: dict) -> tuple[str, dict]:
    """The row's counts: measured where measured, else derived."""
    return ("measured", row["measured"]) if "measured" in row else ("derived", row["derived"])


def check(results: dict) -> list[str]:
    """Measured cases where the package launches more than TRL (or either fails)."""
    worse = []
    for key, row in results["rows"].items():
        if "measured" not in row:
            continue
        trl, ours = (total(row["measured"][side]) for side in ("TRL", "ours"))
        if trl is None or ours is None or ours > trl:
            worse.append(f"{key}: ours {ours if ours is not None else row['measured']['ours'].get('note')} "
                         f"launches, TRL {trl if trl is not None else row['measured']['TRL'].get('note')}")
    return worse


def markdown(results: dict) -> str:
    s = results["scale"]
    lines = [
        SECTION,
        "",
        f"Made by `{results['command']}` on {results['date']} at revision {results['revision']} (the package as "
        f"installed in `.venv-npu`, trl {results['trl']}), emulated {results['soc']}. TRL 1.16's "
        "`trl.trainer.distillation_trainer._chunked_divergence_loss` (its torch path: tiles of 4,096 tokens x "
        "32,768 vocabulary) against `npu_loss_ops.trl.chunked_divergence_loss` (the same call on "
        "`fused_linear_jsd_loss`), issue 52's sizes; one call is the forward and `loss.backward()`, counted "
        "apart; every fourth position masked out. The teacher's H is twice the student's.",
        "",
        "**measured**: at the real N, V and H. **derived**: not run at that size. Neither count depends on H "
        f"or on the shape of a tile or a chunk, only on how many there are: TRL ran with its tile sizes divided "
        f"by {s} on N/{s} x V/{s} (the same token and vocabulary tiles, the last one partial as at V = 151,936), "
        f"the package at the real N (its chunk's rows are a fixed share of N; V cancels out) on V/{s} with H = "
        f"{DERIVED_HIDDEN}. Where a size was measured and derived, both are shown: they agree if the "
        "derivation does. TRL tiles: token tiles x vocabulary tiles (each pass of TRL's visits them all); ours' chunks: "
        "the package's chunks of rows (one `aclnnMm`, the student's logits, each), 33 to 46 launches apiece, by beta and dtype"
        "; the run's JSON: [npu_launches_trl.json](npu_launches_trl.json).",
        "",
        "| N | V | H | beta | dtype | how | TRL tiles | TRL fwd | TRL bwd | TRL | ours' chunks | ours fwd | ours bwd "
        "| ours | ours / TRL |",
        "|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, v, h, beta, dtype in cases():
        row = results["rows"].get(case_key(n, v, h, beta, dtype))
        for kind in ("measured", "derived"):
            if not row or kind not in row:
                continue
            trl, ours = row[kind]["TRL"], row[kind]["ours"]

            def cells(side):
                return ([str(side["fwd"]), str(side["bwd"]), str(total(side))] if "fwd" in side
                        else [side.get("note", "–"), "", ""])

            ratio = f"{total(ours) / total(trl):.2f}x" if total(trl) and total(ours) is not None else "–"
            tiles = -(-n // 4096) * -(-v // 32768)
            chunks = ours.get("fwd_ops", {}).get("aclnnMm", "–")
            lines.append(f"| {n:,} | {v:,} | {h:,} | {beta:g} | {dtype} | {kind} | {tiles} | {' | '.join(cells(trl))} "
                         f"| {chunks} | {' | '.join(cells(ours))} | {ratio} |")
    checks = []
    for key, row in results["rows"].items():
        m = row.get("measured", {})
        if "loss" in m.get("TRL", {}) and "loss" in m.get("ours", {}):
            a, b = m["TRL"]["loss"], m["ours"]["loss"]
            checks.append(f"{key}: TRL {a:.9g}, ours {b:.9g}, relative difference {abs(b - a) / abs(a):.1e}")
    if checks:
        lines += ["", "The loss of each measured call, TRL's against the package's on the emulated NPU (float32 "
                  "within rtol 1e-4 is the check):", "", *[f"- {c}" for c in checks]]
    worse = check(results)
    lines += ["", f"Measured cases where the package launches more than TRL: {len(worse)} of "
              f"{sum('measured' in r for r in results['rows'].values())}."]
    return "\n".join(lines) + "\n"


def write_section(path: str, section: str) -> None:
    """Puts `section` in place of the file's own (from its heading to the next '## ' heading), or appends it."""
    with open(path) as f:
        text = f.read()
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    with open(path, "w") as f:
        f.write(text)


def kept_section(path: str) -> str:
    """The file's section of this table ('' if none): npu_launches.py --combine keeps it when it rewrites the file."""
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        text = f.read()
    start = text.find(SECTION)
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end + 1] if end >= 0 else text[start:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--emulator", help="the emulated CANN's build directory (tests/npu_emulator/build.sh's)")
    parser.add_argument("--family", default="910B", help="the emulated chip family (default 910B)")
    parser.add_argument("--measure", nargs="*", default=[], metavar="N,V,H",
                        help="sizes measured at their real shape (the others derived)")
    parser.add_argument("--derive-measured", action="store_true", help="derive the measured sizes too")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--from-json", help="a run's results: make the table, measure nothing")
    parser.add_argument("--markdown", help="write the table into its section of this file")
    parser.add_argument("--check", action="store_true",
                        help="fail if the package launches more than TRL in any measured case")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
    else:
        if not args.emulator:
            parser.error("--emulator is required to measure")
        results = measure(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    if args.markdown:
        write_section(args.markdown, markdown(results))
    if args.check:
        worse = check(results)
        if worse:
            print("MORE LAUNCHES THAN TRL:\n  " + "\n  ".join(worse))
            return 1
        print("OK: in every measured case the package launches fewer than TRL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
