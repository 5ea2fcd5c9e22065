"""torch.export of a model whose loss uses the ops: the exported program holds npu_loss ops and computes
what eager does, also for a batch size other than the one it was traced with."""
import pytest
import torch

import npu_loss_ops
from samples import LOSSES


class Regressor(torch.nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.net = torch.nn.Linear(6, 4)
        self.loss = loss

    def forward(self, x, y):
        out = self.net(x)
        if self.loss == "kl_div":
            return npu_loss_ops.kl_div(torch.log_softmax(out, -1), torch.softmax(y, -1), reduction="batchmean")
        return getattr(npu_loss_ops, self.loss)(out, y)


@pytest.mark.parametrize("loss", LOSSES)
def test_export_contains_npu_loss_ops_and_matches_eager(loss):
    torch.manual_seed(0)
    model = Regressor(loss)
    x, y = torch.randn(8, 6), torch.randn(8, 4)
    batch = torch.export.Dim("batch", min=2, max=1024)
    exported = torch.export.export(model, (x, y), dynamic_shapes=({0: batch}, {0: batch}))
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert f"npu_loss.{loss}.default" in targets, targets
    for n in (8, 5, 33):
        xn, yn = torch.randn(n, 6), torch.randn(n, 4)
        torch.testing.assert_close(exported.module()(xn, yn), model(xn, yn))
