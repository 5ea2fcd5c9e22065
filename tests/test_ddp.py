"""DistributedDataParallel with two processes (gloo, loopback): each rank computes an npu_loss_ops loss on
its half of the global batch; DDP's averaged gradients must equal a single process's gradients on the
whole batch (reduction "mean", equal halves)."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import npu_loss_ops
from helpers import leave_gloo

# (module class name, constructor kwargs) for each loss.
CRITERIA = [
    ("SmoothL1Loss", {"beta": 0.5}),
    ("L1Loss", {}),
    ("KLDivLoss", {"reduction": "mean"}),
    ("HuberLoss", {"delta": 0.5}),
    ("MSELoss", {}),
]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))


def _batch():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 8, generator=g)
    y = torch.randn(12, 5, generator=g)
    return x, y


def _loss(kind, kwargs, out, y):
    criterion = getattr(npu_loss_ops, kind)(**kwargs)
    if kind == "KLDivLoss":
        return criterion(torch.log_softmax(out, -1), torch.softmax(y, -1))
    return criterion(out, y)


def _worker(rank, world, result_dir):
    # A file store rather than a TCP one: the rank hosting a TCPStore can abort at exit while its peer is
    # still disconnecting ("terminate called without an active exception"); a file store has no server thread.
    store = f"file://{os.path.join(result_dir, 'store')}"
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world)
    finished = False
    try:
        x, y = _batch()
        half = x.shape[0] // world
        rows = slice(rank * half, (rank + 1) * half)
        grads = {}
        for kind, kwargs in CRITERIA:
            model = torch.nn.parallel.DistributedDataParallel(_model())
            _loss(kind, kwargs, model(x[rows]), y[rows]).backward()
            grads[kind] = [p.grad.clone() for p in model.module.parameters()]
        if rank == 0:
            torch.save(grads, os.path.join(result_dir, "ddp_grads.pt"))
        finished = True
    finally:
        leave_gloo(finished)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed gloo")
def test_two_process_ddp_gradients_equal_single_process():
    with tempfile.TemporaryDirectory() as result_dir:
        mp.start_processes(_worker, args=(2, result_dir), nprocs=2, join=True, start_method="spawn")
        ddp = torch.load(os.path.join(result_dir, "ddp_grads.pt"))
    x, y = _batch()
    worst = 0.0
    for kind, kwargs in CRITERIA:
        model = _model()
        _loss(kind, kwargs, model(x), y).backward()
        for got, expected in zip(ddp[kind], (p.grad for p in model.parameters())):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
            worst = max(worst, (got - expected).abs().max().item())
    print(f"\nDDP (2 processes, gloo) vs single process: largest gradient difference {worst:.3g}")
