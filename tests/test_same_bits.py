"""The same bits at every optimization level (docs/cpu_kernels.md, "Sums").

Every sum the CPU kernels take has one written-out accumulation order, so a build at -O0 (DEBUG=1), -O1
(the sanitized build, NPU_LOSS_OPS_SANITIZE) or -O3 (the release build) gives the same bits on each
instruction set. tests/data/reduction_bits.json holds those bits, from the release build, per architecture
and instruction set: the float32 and float64 'mean' and 'sum' of every loss, over sizes that end in every
kind of tail and span several sum chunks, through the dense and the strided loop, the KL target gradient
summed over a broadcast, and the distillation family's row sums and the gradients made with them. This test compares the build it runs from with them: CI runs it from the
release and the sanitized build, scripts/check_releases.sh from a DEBUG=1 build.

After a deliberate change of the order (documented in docs/cpu_kernels.md), rewrite the file from a
release build, on each architecture: python tests/test_same_bits.py --write.
"""
import hashlib
import json
import os
import platform
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BITS_FILE = os.path.join(HERE, "data", "reduction_bits.json")
SIZES = (1, 5, 8, 13, 4096, 3 * 4096 + 5, 100_003)


def _values(n: int, salt: int, dtype: torch.dtype, positive: bool = False) -> torch.Tensor:
    """n values from an integer hash: exact in float32 and float64, the same on every torch release."""
    h = (torch.arange(n, dtype=torch.int64) * 2654435761 + salt * 40503) % 65536
    v = (h.double() + 1) / 65536 if positive else h.double() / 16384 - 2
    return v.to(dtype)


def _hex(t: torch.Tensor) -> str:
    t = t.detach().contiguous()
    if t.numel() == 1:
        return t.double().item().hex() if t.dtype == torch.float64 else float(t.item()).hex()
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:32]


def compute() -> dict:
    """The bits of every case, in this process (its NPU_LOSS_OPS_CPU_ISA)."""
    sys.path.insert(0, HERE)
    import npu_loss_ops
    from samples import LOSSES, functional_kwargs

    out = {}
    for loss in LOSSES:
        for log_target in ((False, True) if loss == "kl_div" else (False,)):
            name = f"{loss}[log]" if log_target else loss
            for dtype in (torch.float32, torch.float64):
                for reduction in ("mean", "sum"):
                    kwargs = functional_kwargs(loss, reduction, 0.5, log_target)
                    fn = getattr(npu_loss_ops, loss)
                    for n in SIZES:
                        x = _values(n, 1, dtype)
                        t = _values(n, 2, dtype, positive=loss == "kl_div" and not log_target)
                        out[f"{name}/{dtype}/{reduction}/{n}"] = _hex(fn(x, t, **kwargs))
                    # The strided loop (target broadcast along a leading dim).
                    x = _values(3 * 1001, 3, dtype).reshape(3, 1001)
                    t = _values(1001, 4, dtype, positive=loss == "kl_div" and not log_target)
                    out[f"{name}/{dtype}/{reduction}/3x1001-broadcast"] = _hex(fn(x, t, **kwargs))
            if loss == "kl_div":
                for dtype in (torch.float32, torch.float64):
                    # The target gradient summed over the broadcast dims (one row sum per target element).
                    x = _values(64 * 777, 5, dtype).reshape(64, 777)
                    t = _values(777, 6, dtype, positive=not log_target)
                    g = _values(64 * 777, 7, dtype).reshape(64, 777)
                    grad = torch.ops.npu_loss.kl_div_target_backward(g, x, t, 0, log_target)
                    out[f"{name}/{dtype}/target_backward_summed/64x777"] = _hex(grad)
    out.update(_row_losses())
    return out


def _row_losses() -> dict:
    """The distillation family's bits: its sums over rows (each row's sum, then the rows in order) and the
    gradients made with them, 'mean' and 'sum', over vocabularies that end in every kind of tail, through the
    direct loop (one dtype, contiguous rows) and the converted one (a slice with an element stride, mixed
    dtypes)."""
    import npu_loss_ops

    out = {}
    for dtype in (torch.float32, torch.float64):
        for v in (1, 5, 13, 4096 + 5, 32001):
            for reduction, op_reduction in (("mean", 1), ("sum", 2)):
                s = _values(6 * v, 8, dtype).reshape(6, v)
                t = _values(6 * v, 9, dtype).reshape(6, v)
                labels = torch.tensor([0, -100, 1, 2, -100, 3])
                value, gs, gt, _ = torch.ops.npu_loss._generalized_jsd_loss_and_grads(
                    s, t, labels, op_reduction, 0.3, 2.0, 1.0, 1.0, None, None, -100, [True, True])
                key = f"generalized_jsd_loss/{dtype}/{reduction}/6x{v}"
                out[key], out[key + "/grads"] = _hex(value), _hex(torch.cat([gs, gt]))
        # The converted loop: every other element of each row, and a float16 teacher.
        s = _values(4 * 2 * 1001, 10, dtype).reshape(4, 2 * 1001)[:, ::2]
        t = _values(4 * 1001, 11, torch.float16).reshape(4, 1001)
        out[f"generalized_jsd_loss/{dtype}/sum/4x1001-strided-float16"] = _hex(
            npu_loss_ops.generalized_jsd_loss(s, t, reduction="sum"))
    return out


# The loss families of the cases' names (the part before the first "/"), and the ones an entry of the file may
# lack: a family added after that entry was written, on a machine (an architecture or instruction set) not
# at hand since. Its other cases are still compared; the test then says what it could not.
ROW_FAMILY = "generalized_jsd_loss"


def _family(case: str) -> str:
    return case.split("/")[0]


def _key(isa: str) -> str:
    return f"{platform.machine()}/{isa}"


def _compute_at(isa: str) -> dict:
    env = dict(os.environ, NPU_LOSS_OPS_CPU_ISA=isa)
    code = f"import json, sys; sys.path.insert(0, {HERE!r}); import test_same_bits as m; print(json.dumps(m.compute()))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _isas() -> list:
    import npu_loss_ops

    return npu_loss_ops.build_info()["cpu_isas_available"]


def _committed() -> dict:
    with open(BITS_FILE) as f:
        return json.load(f)


@pytest.mark.parametrize("isa", _isas())
def test_sums_have_the_committed_bits_at_this_optimization_level(isa):
    import npu_loss_ops

    committed = _committed()
    if _key(isa) not in committed:
        pytest.skip(f"no committed bits for {_key(isa)} (tests/data/reduction_bits.json has {sorted(committed)})")
    want = committed[_key(isa)]
    got = _compute_at(isa)
    unrecorded = ROW_FAMILY not in {_family(case) for case in want}
    if unrecorded:
        got = {case: bits for case, bits in got.items() if _family(case) != ROW_FAMILY}
    assert sorted(got) == sorted(want), "the cases changed: rewrite the file (python tests/test_same_bits.py --write)"
    differ = [case for case in want if got[case] != want[case]]
    info = npu_loss_ops.build_info()
    assert not differ, (f"{len(differ)} of {len(want)} sums differ from the release build's bits at "
                        f"{info['optimization']} (sanitizers: {info['sanitizers']}), {isa}: {differ[:8]}")
    if unrecorded:
        pytest.skip(f"the other {len(want)} sums match; {_key(isa)}'s entry has no {ROW_FAMILY} bits yet: record them "
                    "from a release build on such a machine (python tests/test_same_bits.py --write)")


def main() -> None:
    import npu_loss_ops

    info = npu_loss_ops.build_info()
    if info["optimization"] != "-O3" or info["sanitizers"]:
        sys.exit(f"write the bits from a release build (-O3, no sanitizer); this one is {info['optimization']} "
                 f"{info['sanitizers']}")
    data = _committed() if os.path.exists(BITS_FILE) else {}
    for isa in info["cpu_isas_available"]:
        data[_key(isa)] = _compute_at(isa)
        print(f"{_key(isa)}: {len(data[_key(isa)])} cases")
    os.makedirs(os.path.dirname(BITS_FILE), exist_ok=True)
    with open(BITS_FILE, "w") as f:
        json.dump(dict(sorted(data.items())), f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_same_bits.py --write")
    main()
