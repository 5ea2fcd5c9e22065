"""aclnn launches per call on the emulated NPU: this package's ops against torch_npu's own F, per chip family.

The fused linear JSD's rows (fused_cases) count one call and its backward, chunk by chunk; the sparse JSD's
(sparse_cases) its three ops against its composite, as the generalized JSD's. The generalized
JSD's rows (jsd_cases) compare its three ops with the chunked composite on the same chip (the
composite's kernels called directly), per call and per chunk, and with TRL 1.16's function through torch_npu's
own kernels, at N = 1,024 and 4,096 rows of V = 512 (the counts do not depend on V).

Run inside an emulated-CANN process (scripts/run_npu_emulated.sh runs it once per chip family, as
launches-<family>): for every loss x dtype x reduction (KL: both target forms), one forward call and one
backward call (loss.backward(g), g made before counting), each counted apart from the emulator's trace
(tests/npu_emulator/emulator.py): every aclnn operator whose run phase executed. The same call through
torch.nn.functional with routing off is torch_npu's own kernels. Where the emulator lacks an operator
torch_npu's F needs (its aclop path, a rejected aclnn call, or an error), the cell says so.

    python benchmarks/npu_launches.py --json OUT.json [--check benchmarks/results/npu_launches.json] [--baselines]
        (in an emulated process) measure this family (--baselines: with the JSD's composite and TRL columns,
        which the table needs and --check does not); --check fails (exit 1) if any row of ours launches
        more than the committed table says
    python benchmarks/npu_launches.py --combine A.json B.json ... --json ALL.json --markdown TABLE.md
        (anywhere) merge per-family results into the committed table

benchmarks/README.md ("NPU launches") says how to read the table; npu_launches_table.py has its rows and prints it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from npu_launches_table import (FUSED_CHUNK, JSD_VOCAB, SPARSE_K, cases, check, family_of,  # noqa: E402
                                fused_cases, fused_key, jsd_cases, jsd_key, key, markdown, sparse_cases, sparse_key)


# ---- measuring, on the emulated NPU --------------------------------------------------------------------------


def measure(baselines: bool = True) -> dict:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "npu_emulator"))
    import emulator
    import torch
    import torch.nn.functional as F

    emulator.import_torch_npu()  # through the test harness's step (tests/npu_emulator/c10_keys.py)
    import npu_loss_ops

    if not emulator.active():
        sys.exit("npu_launches.py: not on the emulated CANN (run it through scripts/run_npu_emulated.sh)")
    # Else torch_npu's own F takes the aclop path in the autograd worker on 910 and 310P, and the first such
    # call leaves torch_npu's task queue unusable for every later call, ours included.
    emulator.pin_jit_compile_off()
    warnings.filterwarnings("ignore", message="reduction: 'mean' divides the total loss")
    dev = "npu"

    def launches(trace: dict) -> tuple[int, dict]:
        ops = {k: v for k, v in trace.items() if k.startswith("aclnn") and ":" not in k}
        return sum(ops.values()), ops

    def lacking(trace: dict) -> str:
        bad = sorted(k for k in trace if k.startswith("aclop:") or "GetWorkspaceSize:" in k)
        return ", ".join(bad)

    def one(fn, loss, dtype, reduction):
        """(forward count, backward count, launched ops, note) of one call of fn."""
        gen = torch.Generator().manual_seed(0)
        dt = getattr(torch, dtype)
        x = torch.randn(4, 256, generator=gen)
        if loss.startswith("kl_div"):
            x = x.log_softmax(-1)
            t = torch.rand(4, 256, generator=gen).softmax(-1)
            t = t.log() if loss == "kl_div[log]" else t
        else:
            t = torch.randn(4, 256, generator=gen)
        x = x.to(dev, dt).requires_grad_()
        t = t.to(dev, dt).requires_grad_(loss.startswith("kl_div"))  # KL: the target gradient's kernel runs
        kwargs = {"reduction": reduction}
        if loss == "kl_div[log]":
            kwargs["log_target"] = True
        out = {}
        try:
            torch.npu.synchronize()
            emulator.trace_reset()
            result = fn(x, t, **kwargs)
            trace = emulator.trace()
            out["fwd"], out["fwd_ops"] = launches(trace)
            note = lacking(trace)
            g = torch.ones_like(result)
            torch.npu.synchronize()
            emulator.trace_reset()
            result.backward(g)
            trace = emulator.trace()
            out["bwd"], out["bwd_ops"] = launches(trace)
            note = ", ".join(n for n in (note, lacking(trace)) if n)
            if note:
                out = {"note": f"the emulator lacks what this call needs ({note})"}
        except Exception as e:  # noqa: BLE001  (a cell says what failed instead of stopping the table)
            out = {"note": f"fails on the emulator: {type(e).__name__}: {str(e).splitlines()[0][:120]}"}
        return out

    def host_fallback(name: str) -> list[str]:
        """The ATen ops of F's call that torch_npu has no NPU kernel for: they run on the host (torch_npu's
        CPU fallback), so the trace counts no aclnn launch for them."""
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        ops = []
        for op in (name, f"{name}_backward"):
            packet = getattr(torch.ops.aten, op, None)
            for overload in packet.overloads() if packet is not None else ():
                qualified = f"aten::{op}" + ("" if overload == "default" else f".{overload}")
                if not has(qualified, "PrivateUse1") and not has(qualified, "CompositeImplicitAutograd"):
                    ops.append(qualified)
        return ops

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from reference import trl_generalized_jsd_loss

    def jsd_trl(op, dtype, beta, rows):
        """TRL 1.16's function (restated line by line in tests/reference.py, which test_distillation checks against
        TRL's own) through torch_npu's kernels: 'forward' without gradients, 'forward with gradients' the
        forward and backward() of both logits, 'backward' the backward() alone."""
        gen = torch.Generator().manual_seed(0)
        dt = getattr(torch, dtype)
        grads = op != "forward"
        s, t = (torch.randn(rows, JSD_VOCAB, generator=gen).to(dev, dt).requires_grad_(grads) for _ in range(2))
        labels = torch.arange(rows).remainder(7)
        labels[::4] = -100
        labels = labels.to(dev)
        counts = {}
        try:
            torch.npu.synchronize()
            emulator.trace_reset()
            loss = trl_generalized_jsd_loss(s, t, labels, beta, 1.0, "sum")
            torch.npu.synchronize()
            counts["forward"] = emulator.trace()
            if grads:
                emulator.trace_reset()
                loss.backward()
                torch.npu.synchronize()
                counts["backward"] = emulator.trace()
        except Exception as e:  # noqa: BLE001
            return {"note": f"fails on the emulator: {type(e).__name__}: {str(e).splitlines()[0][:80]}"}
        missing = ", ".join(n for n in (lacking(c) for c in counts.values()) if n)
        if missing:
            return {"note": f"the emulator lacks what this call needs ({missing})"}
        phases = {"forward": ("forward",), "forward with gradients": ("forward", "backward"),
                  "backward": ("backward",)}[op]
        ops = {}
        for phase in phases:
            for name, n in launches(counts[phase])[1].items():
                ops[name] = ops.get(name, 0) + n
        return {"launches": sum(ops.values()), "chunks": 0}

    def traced_launches(call) -> dict:
        """{launches, ops} of what `call` ran on the emulated NPU, or {note} where it failed or the emulator lacks
        an operator it needs."""
        try:
            torch.npu.synchronize()
            emulator.trace_reset()
            call()
            torch.npu.synchronize()
            trace = emulator.trace()
        except Exception as e:  # noqa: BLE001
            return {"note": f"fails on the emulator: {type(e).__name__}: {str(e).splitlines()[0][:120]}"}
        if lacking(trace):
            return {"note": f"the emulator lacks what this call needs ({lacking(trace)})"}
        n, ops = launches(trace)
        return {"launches": n, "ops": ops}

    def row_op_one(member, composite, op, dt, args, softmaxes_per_chunk):
        """{launches, chunks, ops} of one call of a row member's op (`member`: its forward's name; its composite's
        kernel where `composite`): `args` the forward's, the op's own added here."""
        forward = getattr(torch.ops.npu_loss, member)
        packet = {"forward": forward, "forward with gradients": getattr(torch.ops.npu_loss, f"_{member}_and_grads"),
                  "backward": getattr(torch.ops.npu_loss, f"{member}_backward")}[op].default
        if op == "forward with gradients":
            args = (*args, [True, True])
        elif op == "backward":
            args = (torch.tensor(1.0, device=dev, dtype=dt), *args, [True, True])
        fn = (lambda *a: packet._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *a)) if composite else packet
        result = traced_launches(lambda: fn(*args))
        if "note" in result:
            return result
        n, ops = result["launches"], result["ops"]
        counted = {"launches": n, "chunks": ops.get("aclnnLogSoftmax", 0) // softmaxes_per_chunk}
        return counted if composite else {**counted, "ops": ops}  # ours' operators, for --check's message

    def row_labels(rows):
        labels = torch.arange(rows).remainder(7)
        labels[::4] = -100
        return labels.to(dev)

    def jsd_one(composite: bool, op, dtype, beta, rows):
        """{launches, chunks (two log-softmaxes each), ops} of one call of a JSD op (or of its composite)."""
        gen = torch.Generator().manual_seed(0)
        dt = getattr(torch, dtype)
        s, t = (torch.randn(rows, JSD_VOCAB, generator=gen).to(dev, dt) for _ in range(2))
        args = (s, t, row_labels(rows), 2, beta, 1.0, 1.0, 1.0, None, None, -100)
        return row_op_one("generalized_jsd_loss", composite, op, dt, args, 2)

    def sparse_one(composite: bool, op, dtype, beta, rows):
        """{launches, chunks (one student log-softmax each), ops} of one call of a sparse JSD op (or its composite)."""
        gen = torch.Generator().manual_seed(0)
        dt = getattr(torch, dtype)
        s = torch.randn(rows, JSD_VOCAB, generator=gen).to(dev, dt)
        ids = torch.stack([torch.randperm(JSD_VOCAB, generator=gen)[:SPARSE_K] for _ in range(rows)])
        mask = torch.ones(rows, SPARSE_K, dtype=torch.bool)
        ids[:, -1], mask[:, -1] = ids[:, 0], False  # a repeat, masked
        t = torch.randn(rows, JSD_VOCAB, generator=gen).log_softmax(-1).gather(-1, ids).to(dev, dt)
        args = (s, t, ids.to(dev), mask.to(dev), row_labels(rows), 2, beta, 1.0, True, 1.0, None, -100)
        return row_op_one("sparse_jsd_loss", composite, op, dt, args, 1)

    def fused_one(dtype, hard, rows):
        """{launches, chunks, ops} of one call of the fused linear JSD and its backward."""
        gen = torch.Generator().manual_seed(0)
        dt = getattr(torch, dtype)
        shapes = ((rows, 64), (JSD_VOCAB, 64), (rows, 128), (JSD_VOCAB, 128))
        xs, ws, xt, wt = (torch.randn(*s, generator=gen).div(4).to(dev, dt).requires_grad_() for s in shapes)
        labels = row_labels(rows)
        result = traced_launches(lambda: npu_loss_ops.fused_linear_jsd_loss(
            xs, ws, xt, wt, labels, weight_hard_loss=hard, chunk_size=FUSED_CHUNK).backward())
        return result if "note" in result else {**result, "chunks": -(-rows // FUSED_CHUNK)}

    family = os.environ.get("NPU_EMU_SOC", "?")
    # The composite's and TRL's columns (about 6 and 0.03 times ours' launches) only where the table is made:
    # --check compares ours alone.
    jsd_rows = {jsd_key(*case): {"ours": jsd_one(False, *case)} for case in jsd_cases()}
    sparse_rows = {sparse_key(*case): {"ours": sparse_one(False, *case)} for case in sparse_cases()}
    fused_rows = {fused_key(*case): {"ours": fused_one(*case)} for case in fused_cases()}
    if baselines:
        for case in jsd_cases():
            jsd_rows[jsd_key(*case)]["composite"] = jsd_one(True, *case)
        for case in sparse_cases():
            sparse_rows[sparse_key(*case)]["composite"] = sparse_one(True, *case)
    # Ours first, every row: a call of torch_npu's F that fails may leave its task queue unusable.
    ours = {key(*case): one(getattr(npu_loss_ops, case[0].split("[")[0]), *case) for case in cases()}
    rows = {}
    for loss, dtype, reduction in cases():
        name = loss.split("[")[0]
        theirs = one(getattr(F, name), loss, dtype, reduction)
        on_host = host_fallback(name)
        if on_host and "note" not in theirs:
            theirs["host"] = on_host
        rows[key(loss, dtype, reduction)] = {"ours": ours[key(loss, dtype, reduction)], "F": theirs}
    for case in jsd_cases() if baselines else ():  # last, as F: a failing call of torch_npu's may leave its
        jsd_rows[jsd_key(*case)]["TRL"] = jsd_trl(*case)  # task queue unusable
    return {"soc": family, "rows": rows, "jsd_rows": jsd_rows, "sparse_rows": sparse_rows, "fused_rows": fused_rows}


# ---- the table ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="write the results (one family, or --combine's merge) here")
    parser.add_argument("--check", help="the committed table's JSON: fail if any row of ours launches more")
    parser.add_argument("--baselines", action="store_true",
                        help="also measure the generalized JSD's composite and TRL columns (for the table)")
    parser.add_argument("--combine", nargs="+", help="per-family JSON files to merge (measures nothing)")
    parser.add_argument("--markdown", help="with --combine: write the markdown table here")
    args = parser.parse_args()
    if args.combine:
        results = {}
        for path in args.combine:
            with open(path) as f:
                one = json.load(f)
            for row in [*one.get("jsd_rows", {}).values(), *one.get("sparse_rows", {}).values(),
                        *one.get("fused_rows", {}).values()]:
                row["ours"].pop("ops", None)  # the counts are the table; the operators are the run's log
            results[family_of(one["soc"])] = one
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
        if args.markdown:
            # npu_launches_trl.py's section (TRL's chunked divergence loss against ours) is its own run's: kept.
            from npu_launches_trl import kept_section

            kept = kept_section(args.markdown)
            with open(args.markdown, "w") as f:
                f.write(markdown(results) + ("\n" + kept if kept else ""))
        return 0
    measured = measure(baselines=args.baselines)
    with open(args.json, "w") as f:
        json.dump(measured, f, indent=1, sort_keys=True)
    total = sum(row["ours"].get("fwd", 0) + row["ours"].get("bwd", 0) for row in measured["rows"].values())
    jsd = sum(row["ours"].get("launches", 0) for row in measured["jsd_rows"].values())
    sparse = sum(row["ours"].get("launches", 0) for row in measured["sparse_rows"].values())
    fused = sum(row["ours"].get("launches", 0) for row in measured["fused_rows"].values())
    print(f"NPU launches {family_of(measured['soc'])}: {len(measured['rows'])} rows, {total} launches of ours; "
          f"generalized JSD {len(measured['jsd_rows'])} rows, {jsd} launches of ours; sparse JSD "
          f"{len(measured['sparse_rows'])} rows, {sparse} launches of ours; fused linear JSD "
          f"{len(measured['fused_rows'])} rows, {fused} launches of ours")
    if args.check:
        worse = check(measured, args.check)
        if worse:
            print("MISMATCH: more launches than the committed table:\n  " + "\n  ".join(worse))
            return 1
        print(f"OK: no row launches more than {os.path.basename(args.check)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
