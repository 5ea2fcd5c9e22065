"""Short training runs: each npu_loss_ops module gives the same loss curve and parameters as its torch.nn
twin, plain and inside DistributedDataParallel (one gloo process)."""
import copy
import warnings

import pytest
import torch
import torch.distributed as dist

import npu_loss_ops
from helpers import free_port

CASES = [
    ("SmoothL1Loss", {"beta": 0.5}),
    ("SmoothL1Loss", {"beta": 0.0, "reduction": "sum"}),
    ("L1Loss", {}),
    ("KLDivLoss", {"reduction": "batchmean"}),
    ("KLDivLoss", {"reduction": "sum", "log_target": True}),
    ("HuberLoss", {}),
    ("HuberLoss", {"delta": 0.5, "reduction": "sum"}),
    ("MSELoss", {}),
    ("MSELoss", {"reduction": "sum"}),
]


def _data(kind, n=64):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 10, generator=g)
    if kind == "KLDivLoss":
        y = torch.softmax(torch.randn(n, 6, generator=g) * 2, -1)
    else:
        y = torch.randn(n, 6, generator=g)
    return x, y


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))


def _train(model, criterion, kind, kwargs, steps=25, ddp=False):
    x, y = _data(kind)
    if kwargs.get("log_target"):
        y = y.log()
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        batch = slice((step * 16) % 64, (step * 16) % 64 + 16)
        out = net(x[batch])
        if kind == "KLDivLoss":
            out = torch.log_softmax(out, -1)
        loss = criterion(out, y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float64), [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("kind,kwargs", CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_training_matches_torch_nn(kind, kwargs):
    model = _model()
    ours_losses, ours_params = _train(copy.deepcopy(model), getattr(npu_loss_ops, kind)(**kwargs), kind, kwargs)
    ref_losses, ref_params = _train(copy.deepcopy(model), getattr(torch.nn, kind)(**kwargs), kind, kwargs)
    assert ours_losses[-1] < ours_losses[0], "the loss went down"
    torch.testing.assert_close(ours_losses, ref_losses, rtol=1e-4, atol=1e-6)
    for a, b in zip(ours_params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.fixture
def single_process_group():
    if not dist.is_available():
        pytest.skip("reason: torch.distributed is not available in this build")
    if dist.is_initialized():
        pytest.skip("reason: a process group already exists")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("kind,kwargs", [CASES[0], CASES[3]], ids=["SmoothL1Loss", "KLDivLoss"])
def test_training_inside_ddp(single_process_group, kind, kwargs):
    """Works unchanged inside DistributedDataParallel (README, "Distributed training")."""
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ddp_losses, ddp_params = _train(copy.deepcopy(model), getattr(npu_loss_ops, kind)(**kwargs), kind,
                                        kwargs, steps=10, ddp=True)
    plain_losses, plain_params = _train(copy.deepcopy(model), getattr(torch.nn, kind)(**kwargs), kind, kwargs,
                                        steps=10)
    torch.testing.assert_close(ddp_losses, plain_losses, rtol=1e-4, atol=1e-6)
    for a, b in zip(ddp_params, plain_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
