"""Smoke test of the host-emulated CANN with the real torch_npu.

    python tests/npu_emulator/smoke.py --all OUT_DIR     one process per chip family (and one on the
                                                         libopapi.so without the loss APIs); summary
    python tests/npu_emulator/smoke.py                   in a process already set up with emulator.env()

Each run: torch_npu imports and sees one NPU; basic tensor work (bf16/fp16, a backward pass, the ATen ops
the project's composite fallback uses) matches the CPU; torch_npu's own loss-gradient ops
(torch.ops.aten.smooth_l1_loss_backward, torch.ops.npu.l1_loss_backward, torch.ops.npu.kl_div_target_backward)
and the forwards (F.smooth_l1_loss, F.l1_loss, F.kl_div) reach the emulated aclnn APIs and give the documented
chip-by-chip results (docs/aclnn_reference.md), or the documented 161002 where the chip rejects the call; the
GetWorkspaceSize validation is also probed directly with ctypes; the trace shows the aclnn APIs ran and no
aclop path was taken.
"""

import argparse
import ctypes
import importlib.util
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _emulator():
    spec = importlib.util.spec_from_file_location("npu_emulator_helpers", os.path.join(HERE, "emulator.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------------------
# Driver: one subprocess per family.

def run_all(out_dir, families):
    emu = _emulator()
    runs = [(f, False) for f in families] + [("910B", True)]
    failed = []
    for fam, old in runs:
        label = fam + (" (libopapi.so without the loss APIs)" if old else "")
        t0 = time.time()
        e = emu.env(fam, out_dir, without_loss_apis=old)
        if old:
            e["NPU_EMU_SMOKE_WITHOUT_LOSS_APIS"] = "1"
        p = subprocess.run([sys.executable, os.path.abspath(__file__)], env=e, capture_output=True, text=True)
        lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
        status = "PASS" if p.returncode == 0 else f"FAIL (exit {p.returncode})"
        print(f"=== {label}: {e['NPU_EMU_SOC']}: {status} in {time.time() - t0:.1f} s")
        for ln in lines:
            print("    " + ln)
        if p.returncode != 0:
            failed.append(label)
            print("    --- stderr (tail) ---")
            for ln in p.stderr.splitlines()[-25:]:
                print("    " + ln)
    print(f"smoke: {len(runs) - len(failed)}/{len(runs)} runs passed" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------------
# Checks inside one emulated process.

class Checker:
    def __init__(self):
        self.n = 0
        self.failures = []

    def ok(self, cond, what):
        self.n += 1
        if not cond:
            self.failures.append(what)
            print("FAILED:", what, flush=True)


def close(torch, got, want, dtype, scale=1.0):
    tol = {torch.float32: (1e-5, 1e-6), torch.float16: (1e-3, 1e-4), torch.bfloat16: (8e-3, 1e-3)}[dtype]
    tol = (tol[0] * scale, tol[1] * scale)
    got = got.detach().cpu().double()
    want = want.detach().cpu().double()
    if got.shape != want.shape:
        return False
    return bool(torch.allclose(got, want, rtol=tol[0], atol=tol[1], equal_nan=True))


def main_emulated():
    import torch
    import torch.nn.functional as F
    import torch_npu  # noqa: F401

    emu = _emulator()
    soc = os.environ.get("NPU_EMU_SOC", "Ascend910B1")
    fam = next((k for k, v in emu.SOCS.items() if v == soc), "910B")
    old_cann = os.environ.get("NPU_EMU_SMOKE_WITHOUT_LOSS_APIS") == "1"
    c = Checker()
    # torch_npu keeps "JIT compile off" per thread; its autograd worker would re-derive it from the chip on
    # 910/310P and take the aclop path. Pin it.
    torch.npu.set_compile_mode(jit_compile=False)

    dev = "npu"
    c.ok(torch.npu.is_available() and torch.npu.device_count() == 1, "torch.npu.is_available() with one device")
    c.ok(emu.active(), "emulator.active()")
    torch.manual_seed(0)

    # --- basic tensor work -------------------------------------------------------------------------------
    w, v = torch.randn(3, 4), torch.randn(3, 4)
    nw, nv = w.to(dev), v.to(dev)
    c.ok(torch.equal((nw + nv).cpu(), w + v), "add")
    c.ok(close(torch, nw.bfloat16() * 2, w.bfloat16() * 2, torch.bfloat16), "bf16 mul")
    c.ok(close(torch, nw.half() + nv.half(), w.half() + v.half(), torch.float16), "fp16 add")
    r = torch.randn(1000, device=dev)
    c.ok(r.device.type == "npu" and abs(r.mean().item()) < 0.2 and 0.8 < r.std().item() < 1.2, "randn on npu")
    a = torch.randn(5, device=dev, requires_grad=True)
    (a * a).sum().backward()
    c.ok(close(torch, a.grad, 2 * a.detach().cpu(), torch.float32), "backward of (a*a).sum()")
    torch.testing.assert_close(nw, nw.clone())
    c.ok(torch.allclose(nw, nw) and torch.equal(nw, nw) and not torch.equal(nw, nv), "allclose / equal")
    c.ok(nw[1, 2].item() == w[1, 2].item() and "npu" in repr(nw), ".item() and printing")

    # The ATen ops the project's composite fallback runs on the NPU, against the CPU.
    b = torch.randn(4, 3).t()  # non-contiguous
    comp = {
        "sub": lambda x, y, z: x - y, "sign": lambda x, y, z: torch.sign(torch.cat([x, x * 0])),
        "sgn": lambda x, y, z: torch.sgn(x), "mul": lambda x, y, z: x * y, "div": lambda x, y, z: x / y,
        "abs": lambda x, y, z: z.abs(), "where": lambda x, y, z: torch.where(x > 0, x, y),
        "log": lambda x, y, z: x.abs().log(), "exp": lambda x, y, z: x.exp(),
        "xlogy": lambda x, y, z: torch.xlogy(x.abs(), y.abs()), "xlogy0": lambda x, y, z: torch.xlogy(x * 0, y.abs()),
        "sum_shape": lambda x, y, z: x.sum_to_size(1, 4), "sum_dims": lambda x, y, z: x.sum((0, 1)),
        "sum_keepdim": lambda x, y, z: x.sum(1, keepdim=True), "masked_fill": lambda x, y, z: x.masked_fill(x > 0, 0.0),
        "eq": lambda x, y, z: x == x.clamp(-0.5, 0.5), "isinf": lambda x, y, z: torch.isinf(x / 0),
        "isposinf": lambda x, y, z: torch.isposinf(x / 0), "clamp": lambda x, y, z: x.clamp(-0.5, 0.5),
        "expand": lambda x, y, z: x[:1].expand(3, 4) + 0, "to_bf16": lambda x, y, z: z.to(torch.bfloat16),
        "to_half": lambda x, y, z: x.to(torch.float16), "copy_": lambda x, y, z: x.clone().copy_(z),
        "zero_": lambda x, y, z: x.clone().zero_(), "fill_": lambda x, y, z: x.clone().fill_(0.25),
        "empty_like": lambda x, y, z: torch.empty_like(x).fill_(1), "full": lambda x, y, z: torch.full((2, 2), 3.0, device=x.device),
        "promote_fp16_bf16": lambda x, y, z: x.half() + y.bfloat16(), "promote_fp16_fp32": lambda x, y, z: x.half() * y,
        "mask_index": lambda x, y, z: x[x > 0], "nonzero": lambda x, y, z: torch.nonzero(x > 0),
    }
    for name, f in comp.items():
        want, got = f(w, v, b), f(nw, nv, b.to(dev))
        c.ok(got.dtype == want.dtype and close(torch, got.float(), want.float(), torch.float32), f"composite op {name}")

    emu.trace_reset()

    # --- the loss gradients through torch_npu -------------------------------------------------------------
    tbe = fam != "950"
    bf16_ok = fam in ("910B", "910_93", "950")
    kl_ok = fam in ("910B", "910_93", "950")
    none = fam == "310B"

    def expect_reject(fn, api, what):
        """The call must raise with 161002 and leave the process working."""
        try:
            out = fn()
            torch.npu.synchronize()
            c.ok(False, f"{what}: expected 161002 from {api}, got a result {tuple(out.shape)}")
        except RuntimeError as e:
            c.ok("161002" in str(e), f"{what}: {api} raised 161002 ({str(e).splitlines()[0][:80]})")
        c.ok(torch.equal((nw * 2).cpu(), w * 2), f"{what}: the process still works after the rejection")

    def ref_smooth(g, x, t, red, beta, scalar_grad):
        g, x, t = g.double(), x.double(), t.double()
        d = x - t
        if tbe:  # §1.1 TBE: (-1 if d <= -b) + (1 if d >= b) + d/(b+1e-6) if |d| < b; NaN d -> 0 in comparisons
            dc = torch.where(d.isnan(), torch.zeros_like(d), d)
            f = -(dc <= -beta).double() + (dc >= beta).double() + torch.where(dc.abs() < beta, d / (beta + 1e-6), 0.0)
        else:    # §1.1 950: 1/b = NaN for b < 1e-6; strict (tensor grad) or inclusive (scalar grad) comparisons
            inv = math.nan if beta < 1e-6 else 1.0 / beta
            if scalar_grad:
                pos, neg, big = d >= beta, d <= -beta, d.abs() >= beta
            else:
                pos, neg, big = d > beta, d < -beta, d.abs() > beta
            f = pos.double() - neg.double() + torch.where(big, 0.0, d * inv)
        cof = 1.0 / x.numel() if red == 1 else 1.0  # mean: numel(self)
        return f * g * cof

    def ref_l1(g, x, t, red):
        x, t = torch.broadcast_tensors(x.double(), t.double())
        if tbe:  # §2.1 TBE: (p > l ? 1 : -1), then (p != l ? sign : 0): NaN -> -g
            s = torch.where(x > t, 1.0, -1.0)
            s = torch.where(x != t, s, 0.0)
        else:    # §2.1 950: NaN -> 0
            s = torch.where(x < t, -1.0, torch.where(x > t, 1.0, 0.0))
        cof = 1.0 / x.numel() if red == 1 else 1.0  # mean: numel(broadcast)
        return s * g.double() * cof

    def ref_kl(g, x, t, red, log_target):
        g, x, t = g.double(), x.double(), t.double()
        B = torch.broadcast_shapes(x.shape, t.shape)
        n = x.numel() if not tbe else math.prod(B)  # §3.1 mean: numel(B) (910B/910_93), numel(self) (950)
        gp = g * (1.0 / n if red == 1 else 1.0)
        r = gp * t.exp() * (t + 1 - x) if log_target else gp * t.log() - gp * x + (gp * t) / t
        return r.expand(B).sum_to_size(t.shape)

    smooth_api, l1_api, kl_api = "aclnnSmoothL1LossBackward", "aclnnL1LossBackward", "aclnnKlDivTargetBackward"
    if old_cann:
        # The libopapi.so without the loss APIs: torch_npu falls back to the aclop path, which fails loudly.
        x, t = torch.randn(6, device=dev), torch.randn(6, device=dev)
        g = torch.ones((), device=dev)
        try:
            torch.ops.aten.smooth_l1_loss_backward(g, x, t, 1, 1.0)
            torch.npu.synchronize()
            c.ok(False, "smooth_l1_loss_backward without the aclnn API must fail")
        except RuntimeError:
            pass
        tr = emu.trace()
        c.ok(any(k.startswith("aclop:") for k in tr), f"without the loss APIs torch_npu takes the aclop path: {tr}")
        print(f"{soc} without the loss APIs: aclop fallbacks {sorted(k for k in tr if k.startswith('aclop:'))}; "
              f"{c.n} checks", flush=True)
        return finish(c)

    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    for dt in dtypes:
        supported = bf16_ok or dt != torch.bfloat16
        x = (torch.rand(4, 5) * 4 - 2).to(dt)
        t = (torch.rand(4, 5) * 4 - 2).to(dt)
        x[0, 0], t[0, 0] = float("nan"), 0.0
        x[1, 1], t[1, 1] = 0.5, 0.5  # d == 0
        for red in (0, 1, 2):
            g = (torch.rand(4, 5) + 0.5).to(dt) if red == 0 else torch.tensor(1.5, dtype=dt)
            for beta in (1.0, 1e-3, 0.0):
                f = lambda: torch.ops.aten.smooth_l1_loss_backward(g.to(dev), x.to(dev), t.to(dev), red, beta)  # noqa: E731
                what = f"smooth_l1_loss_backward {dt} reduction={red} beta={beta}"
                if none or not supported:
                    if red == 1 and beta == 1.0:
                        expect_reject(f, smooth_api, what)
                    continue
                c.ok(close(torch, f(), ref_smooth(g, x, t, red, beta, g.numel() == 1), dt), what)
            f = lambda: torch.ops.npu.l1_loss_backward(g.to(dev), x.to(dev), t.to(dev), red)  # noqa: E731
            what = f"l1_loss_backward {dt} reduction={red}"
            if none or not supported:
                if red == 1:
                    expect_reject(f, l1_api, what)
            else:
                c.ok(close(torch, f(), ref_l1(g, x, t, red), dt), what)
        # KL target gradient: t == 0 gives NaN (log_target=False); the mean divisor differs on 950 when self is
        # smaller than broadcast(self, target); a target smaller than that is reduce-summed to its shape.
        for xshape, tshape in (((1, 5), (3, 5)), ((3, 5), (1, 5))):
            xs = (torch.rand(*xshape) - 1).to(dt)
            ts = torch.rand(*tshape).to(dt)
            ts[0, 0] = 0.0
            for red in (0, 1, 2):
                gk = torch.rand(3, 5).to(dt) if red == 0 else torch.tensor(1.0, dtype=dt)
                for lt in (False, True):
                    f = lambda: torch.ops.npu.kl_div_target_backward(  # noqa: E731
                        gk.to(dev), xs.to(dev), ts.to(dev), red, log_target=lt)
                    what = f"kl_div_target_backward {dt} self{xshape} target{tshape} reduction={red} log_target={lt}"
                    if not kl_ok or not supported:
                        if red == 1 and not lt and xshape == (1, 5):
                            expect_reject(f, kl_api, what)
                        continue
                    got = f()
                    c.ok(close(torch, got, ref_kl(gk, xs, ts, red, lt), dt, scale=4.0), what)
                    if not lt:
                        c.ok(bool(got.cpu()[0, 0].isnan()), f"{what}: NaN at target == 0")

    # Documented chip differences, spelled out.
    if not none:
        x = torch.tensor([0.0, 0.0005, -3.0, 2.0], device=dev)
        t = torch.zeros(4, device=dev)
        gi = torch.ops.aten.smooth_l1_loss_backward(torch.ones(4, device=dev), x, t, 0, 0.0).cpu()
        c.ok(math.isnan(gi[0]) if not tbe else gi[0] == 0, f"smooth L1 beta=0 at d=0 (tensor grad): {gi[0].item()}")
        gi = torch.ops.aten.smooth_l1_loss_backward(torch.ones(4, device=dev), x, t, 0, 1e-3).cpu()
        want = 0.0005 / (1e-3 + 1e-6) if tbe else 0.5
        c.ok(abs(gi[1].item() - want) < 1e-6, f"smooth L1 beta=1e-3 quadratic branch: {gi[1].item():.7f} (want {want:.7f})")
        gl = torch.ops.npu.l1_loss_backward(torch.ones(2, device=dev), torch.tensor([math.nan, 1.0], device=dev),
                                            torch.zeros(2, device=dev), 0).cpu()
        c.ok(gl[0].item() == (-1.0 if tbe else 0.0), f"L1 gradient at NaN: {gl[0].item()}")
        # mean divides by numel(self), not the broadcast count: self (4,1), target (1,4)
        gm = torch.ops.aten.smooth_l1_loss_backward(torch.tensor(1.0, device=dev), torch.full((4, 1), 3.0, device=dev),
                                                    torch.zeros(1, 4, device=dev), 1, 1.0).cpu()
        c.ok(gm.shape == (4, 4) and torch.allclose(gm, torch.full((4, 4), 0.25)), "smooth L1 mean / numel(self)")
        # empty inputs: success, nothing launched
        e = torch.ops.aten.smooth_l1_loss_backward(torch.ones(0, 3, device=dev), torch.ones(0, 3, device=dev),
                                                   torch.ones(0, 3, device=dev), 0, 1.0)
        c.ok(e.shape == (0, 3) and emu.trace().get(smooth_api + ":empty", 0) >= 1, "empty smooth L1 backward")

    # Forwards through torch_npu (F.* on npu tensors reach aclnnSmoothL1Loss / aclnnL1Loss / aclnnKlDiv).
    x, t = torch.randn(3, 4), torch.rand(3, 4)
    t[0, 0] = 0.0
    for name, f, api in (
        ("smooth_l1_loss", lambda a, b: F.smooth_l1_loss(a, b, beta=0.5), "aclnnSmoothL1Loss"),
        ("l1_loss", lambda a, b: F.l1_loss(a, b, reduction="sum"), "aclnnL1Loss"),
        ("kl_div", lambda a, b: F.kl_div(a, b, reduction="none"), "aclnnKlDiv"),
    ):
        if none:
            expect_reject(lambda: f(x.to(dev), t.to(dev)), api, name)
            continue
        got, want = f(x.to(dev), t.to(dev)).cpu(), f(x, t)
        if name == "kl_div":
            # §4: t·(log t − self): NaN at t == 0 on the TBE chips; the 950 kernel makes it 0 (PyTorch's value)
            c.ok((math.isnan(got[0, 0]) if tbe else got[0, 0] == 0), f"kl_div forward at t == 0: {got[0, 0].item()}")
            got, want = got[1:], want[1:]
        c.ok(close(torch, got, want, torch.float32), f"forward {name}")

    tr = emu.trace()
    aclop = sorted(k for k in tr if k.startswith("aclop:"))
    c.ok(not aclop, f"no aclop path taken: {aclop}")
    if none:
        for api in (smooth_api, l1_api, kl_api, "aclnnSmoothL1Loss", "aclnnL1Loss", "aclnnKlDiv"):
            c.ok(tr.get(api + "GetWorkspaceSize:161002", 0) >= 1 and tr.get(api, 0) == 0, f"{api} rejected on 310B")
    else:
        for api in (smooth_api, l1_api, "aclnnSmoothL1Loss", "aclnnL1Loss", "aclnnKlDiv"):
            c.ok(tr.get(api, 0) >= 1, f"trace shows {api} ran ({tr.get(api, 0)} times)")
        c.ok((tr.get(kl_api, 0) >= 1) == kl_ok, f"trace shows {kl_api} ran only where supported ({tr.get(kl_api, 0)})")

    validation_probe(c, fam)
    loss_runs = {k: v for k, v in sorted(tr.items()) if "Loss" in k or "KlDiv" in k}
    print(f"{soc} ({fam}): {c.n} checks; loss API trace {loss_runs}", flush=True)
    return finish(c)


def validation_probe(c, fam):
    """GetWorkspaceSize validation called directly (ctypes), no torch_npu in between."""
    lib = ctypes.CDLL("libopapi.so", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    P = ctypes.c_void_p
    lib.aclCreateTensor.restype = P
    lib.aclCreateTensor.argtypes = [P, ctypes.c_uint64, ctypes.c_int, P, ctypes.c_int64, ctypes.c_int, P,
                                    ctypes.c_uint64, P]
    lib.aclDestroyTensor.argtypes = [P]
    lib.aclDestroyAclOpExecutor.argtypes = [P]
    FLOAT, FLOAT16, BF16, INT32, DOUBLE = 0, 1, 27, 3, 11
    ND, NZ = 2, 29
    made = []

    def tensor(shape, dtype=FLOAT, fmt=ND):
        n = len(shape)
        dims = (ctypes.c_int64 * max(n, 1))(*shape)
        strides = [1] * n
        for i in range(n - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        st = (ctypes.c_int64 * max(n, 1))(*strides)
        total = (ctypes.c_int64 * 1)(math.prod(shape))
        h = lib.aclCreateTensor(dims, n, dtype, st, 0, fmt, total, 1, None)
        made.append(h)
        return h

    def call(fn, *args):
        ws, ex = ctypes.c_uint64(0), P(0)
        st = fn(*args, ctypes.byref(ws), ctypes.byref(ex))
        if st == 0 and ex.value:
            lib.aclDestroyAclOpExecutor(ex)
        return st

    smooth = lib.aclnnSmoothL1LossBackwardGetWorkspaceSize
    smooth.argtypes = [P, P, P, ctypes.c_int64, ctypes.c_float, P, P, P]
    l1 = lib.aclnnL1LossBackwardGetWorkspaceSize
    l1.argtypes = [P, P, P, ctypes.c_int64, P, P, P]
    kl = lib.aclnnKlDivTargetBackwardGetWorkspaceSize
    kl.argtypes = [P, P, P, ctypes.c_int64, ctypes.c_bool, P, P, P]
    s = [4, 3]
    ok = 161002 if fam == "310B" else 0
    kl_ok = 0 if fam in ("910B", "910_93", "950") else 161002
    cases = [
        ("smooth null gradOut", call(smooth, None, tensor(s), tensor(s), 1, 1.0, tensor(s)), 161001),
        ("smooth fp32 ok", call(smooth, tensor(s), tensor(s), tensor(s), 1, 1.0, tensor(s)), ok),
        ("smooth double", call(smooth, tensor(s), tensor(s, DOUBLE), tensor(s), 1, 1.0, tensor(s)), 161002),
        ("smooth reduction 3", call(smooth, tensor(s), tensor(s), tensor(s), 3, 1.0, tensor(s)), 161002),
        ("smooth beta -1", call(smooth, tensor(s), tensor(s), tensor(s), 0, -1.0, tensor(s)), 161002),
        ("smooth beta NaN", call(smooth, tensor(s), tensor(s), tensor(s), 0, math.nan, tensor(s)), 161002),
        ("smooth 9 dims", call(smooth, tensor([1] * 9), tensor(s), tensor(s), 0, 1.0, tensor(s)), 161002),
        ("smooth out shape", call(smooth, tensor(s), tensor(s), tensor(s), 0, 1.0, tensor([4, 4])), 161002),
        ("smooth fp16/fp32/fp16 -> fp16", call(smooth, tensor(s, FLOAT16), tensor(s), tensor(s, FLOAT16), 0, 1.0,
                                                tensor(s, FLOAT16)), ok),
        ("l1 reduction 3", call(l1, tensor(s), tensor(s), tensor(s), 3, tensor(s)), 161002),
        ("l1 int32 gradOutput promotes", call(l1, tensor(s, INT32), tensor(s), tensor(s), 0, tensor(s)), ok),
        ("l1 int32 gradInput", call(l1, tensor(s), tensor(s), tensor(s), 0, tensor(s, INT32)), 161002),
        ("l1 broadcast out", call(l1, tensor([4, 1]), tensor([1, 3]), tensor(s), 2, tensor(s)), ok),
        ("kl reduction 6", call(kl, tensor(s), tensor(s), tensor(s), 6, False, tensor(s)), kl_ok),
        ("kl private format", call(kl, tensor(s), tensor(s), tensor(s, fmt=NZ), 0, False, tensor(s)),
         161002),
        ("kl gradOutput enlarges", call(kl, tensor([2, 4, 3]), tensor(s), tensor(s), 0, False, tensor(s)), 161002),
        ("kl gradTarget dtype", call(kl, tensor(s), tensor(s), tensor(s), 0, False, tensor(s, FLOAT16)), 161002),
        ("kl bf16", call(kl, tensor(s, BF16), tensor(s, BF16), tensor(s, BF16), 1, True, tensor(s, BF16)), kl_ok),
    ]
    for what, got, want in cases:
        c.ok(got == want, f"GetWorkspaceSize {what}: {got} (want {want})")
    for h in made:
        if h:
            lib.aclDestroyTensor(h)


def finish(c):
    if c.failures:
        print(f"{len(c.failures)} of {c.n} checks FAILED", flush=True)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", metavar="OUT_DIR", help="run every chip family, each in its own process")
    ap.add_argument("--families", nargs="*", default=None, help="with --all: the families to run")
    args = ap.parse_args()
    if args.all:
        fams = args.families or list(_emulator().SOCS)
        return run_all(args.all, fams)
    return main_emulated()


if __name__ == "__main__":
    sys.exit(main())
