"""Concurrency and memory: eight Python threads calling every op at once get the single-threaded results,
and 10,000 calls of each op (and of each error path) leave the process's resident memory flat."""
import ctypes
import math
import threading

import pytest
import torch

import npu_loss_ops

ops = torch.ops.npu_loss


def _calls():
    """Every overload once, on inputs large enough to use the thread pool, as (name, thunk)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 1031, generator=g)
    t = torch.randn(64, 1031, generator=g)
    p = torch.rand(64, 1031, generator=g) + 0.01
    go = torch.randn(64, 1031, generator=g)
    one = torch.tensor(0.7)
    row = torch.rand(1, 1031, generator=g) + 0.01
    return [
        ("smooth_l1_loss", lambda: ops.smooth_l1_loss(x, t, 1, 0.5)),
        ("smooth_l1_loss_backward", lambda: ops.smooth_l1_loss_backward(go, x, t, 0, 0.5)),
        ("smooth_l1_loss_backward.grad_input",
         lambda: ops.smooth_l1_loss_backward.grad_input(one, x, t, 1, 0.5, grad_input=torch.empty_like(x))),
        ("l1_loss", lambda: ops.l1_loss(x, t, 2)),
        ("l1_loss_backward", lambda: ops.l1_loss_backward(go, x, t, 1)),
        ("l1_loss_backward.grad_input",
         lambda: ops.l1_loss_backward.grad_input(go, x, t, 0, grad_input=torch.empty_like(x))),
        ("kl_div", lambda: ops.kl_div(x, p, 1, log_target=False)),
        ("kl_div_target_backward", lambda: ops.kl_div_target_backward(one, x, row, 1, False)),
        ("kl_div_target_backward.grad_target",
         lambda: ops.kl_div_target_backward.grad_target(go, x, t, 0, True, grad_target=torch.empty_like(t))),
        ("huber_loss", lambda: ops.huber_loss(x, t, 1, 0.5)),
        ("huber_loss_backward", lambda: ops.huber_loss_backward(go, x, t, 0, 0.5)),
        ("huber_loss_backward.out",
         lambda: ops.huber_loss_backward.out(one, x, t, 1, 0.5, grad_input=torch.empty_like(x))),
        ("mse_loss", lambda: ops.mse_loss(x, t, 1)),
        ("mse_loss_backward", lambda: ops.mse_loss_backward(go, x, t, 0)),
        ("mse_loss_backward.grad_input",
         lambda: ops.mse_loss_backward.grad_input(one, x, t, 2, grad_input=torch.empty_like(x))),
    ]


def test_eight_threads_calling_every_op_get_the_single_threaded_results():
    calls = _calls()
    expected = {name: fn() for name, fn in calls}
    failures = []
    barrier = threading.Barrier(8)

    def worker(k):
        barrier.wait()
        for rep in range(20):
            for name, fn in calls[k % len(calls):] + calls[:k % len(calls)]:
                got = fn()
                if not torch.equal(got, expected[name]):
                    failures.append((k, rep, name))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures, failures[:5]


def _memory_in_use():
    """The process's memory in use, and what it is: the resident set under glibc's allocator; under
    AddressSanitizer, whose quarantine keeps freed blocks resident (RSS grows by tens of MiB with no leak),
    the bytes its allocator has handed out and not had back (__sanitizer_get_current_allocated_bytes)."""
    if "address" in npu_loss_ops.build_info()["sanitizers"]:
        allocated = ctypes.CDLL(None).__sanitizer_get_current_allocated_bytes
        allocated.restype = ctypes.c_size_t
        return "heap in use (AddressSanitizer's count)", int(allocated())
    with open("/proc/self/statm") as f:
        return "RSS", int(f.read().split()[1]) * 4096


def _bad_calls():
    """One rejected call per overload (each raises from the C++ checks)."""
    x = torch.randn(8, 4)
    i = torch.ones(8, 4, dtype=torch.int32)
    return [
        lambda: ops.smooth_l1_loss(x, x, 1, -1.0),
        lambda: ops.smooth_l1_loss_backward(x, i, x, 0, 1.0),
        lambda: ops.smooth_l1_loss_backward.grad_input(x, x, x, 0, 1.0, grad_input=torch.empty(3)),
        lambda: ops.l1_loss(x, torch.randn(3, 3), 1),
        lambda: ops.l1_loss_backward(x, x, x, 7),
        lambda: ops.l1_loss_backward.grad_input(x, x, x, 0, grad_input=i),
        lambda: ops.kl_div(x.reshape(2, 2, 2, 1, 1, 1, 1, 1, 4), x, 1),
        lambda: ops.kl_div_target_backward(torch.randn(2, 8, 4), x, x, 0, False),
        lambda: ops.kl_div_target_backward.grad_target(x, x, x, 0, False, grad_target=x.double()),
        lambda: ops.huber_loss(x, x, 1, 0.0),
        lambda: ops.huber_loss_backward(x, x, x, 0, math.nan),
        lambda: ops.huber_loss_backward.out(x, x, x, 0, 1.0, grad_input=torch.empty(3)),
        lambda: ops.mse_loss(x.int(), x, 1),
        lambda: ops.mse_loss_backward(x, x, x, 3),
        lambda: ops.mse_loss_backward.grad_input(x, x, x, 0, grad_input=i),
    ]


@pytest.mark.parametrize("kind", ["valid", "rejected"])
def test_ten_thousand_calls_leave_memory_flat(kind):
    if kind == "valid":
        x, t, g = torch.randn(256), torch.rand(256) + 0.1, torch.randn(256)
        out = torch.empty(256)
        thunks = [
            lambda: ops.smooth_l1_loss(x, t, 1, 1.0),
            lambda: ops.smooth_l1_loss_backward(g, x, t, 0, 1.0),
            lambda: ops.smooth_l1_loss_backward.grad_input(g, x, t, 0, 1.0, grad_input=out),
            lambda: ops.l1_loss(x, t, 0),
            lambda: ops.l1_loss_backward(g, x, t, 1),
            lambda: ops.l1_loss_backward.grad_input(g, x, t, 0, grad_input=out),
            lambda: ops.kl_div(x, t, 2, log_target=True),
            lambda: ops.kl_div_target_backward(g, x, t, 0, False),
            lambda: ops.kl_div_target_backward.grad_target(g, x, t, 0, False, grad_target=out),
            lambda: ops.huber_loss(x, t, 1, 0.5),
            lambda: ops.huber_loss_backward(g, x, t, 0, 0.5),
            lambda: ops.huber_loss_backward.out(g, x, t, 0, 0.5, grad_input=out),
            lambda: ops.mse_loss(x, t, 2),
            lambda: ops.mse_loss_backward(g, x, t, 1),
            lambda: ops.mse_loss_backward.grad_input(g, x, t, 0, grad_input=out),
        ]
    else:
        thunks = _bad_calls()

    def run(n):
        for fn in thunks:
            for _ in range(n):
                try:
                    fn()
                except (TypeError, ValueError, RuntimeError):
                    pass

    run(1000)  # warm-up: allocator caches, lazily built dispatch tables
    what, before = _memory_in_use()
    run(10_000)
    _, after = _memory_in_use()
    growth = after - before
    print(f"\n{kind}: {what} {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB after 10,000 calls of each of "
          f"{len(thunks)} overloads")
    # A leak of even one 256-float tensor per call would be 90 MiB here.
    assert growth < 8 * 2**20, f"{what} grew by {growth / 2**20:.1f} MiB"
