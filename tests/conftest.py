import pytest
import torch

import npu_loss_ops


def _npu_available() -> bool:
    return bool(getattr(npu_loss_ops, "npu_kernels_available", lambda: False)())


def pytest_collection_modifyitems(config, items):
    if _npu_available():
        return
    skip = pytest.mark.skip(reason="needs torch_npu with the aclnn kernels (npu_loss_ops.npu_kernels_available() is False)")
    for item in items:
        if "npu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded_and_restored():
    """Every test starts from the same RNG state and leaves the thread count as it found it."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    # KL's 'mean' warning (PyTorch's own, reproduced by the API) is expected wherever 'mean' is tested.
    config.addinivalue_line("filterwarnings", "ignore:reduction. 'mean' divides the total loss:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
