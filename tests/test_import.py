"""Importing the package is quiet, with NumPy and without it, and the fake (meta) kernels work in a process
without NumPy.

Each check runs in a fresh interpreter with ``-W error``, so any warning during the import fails it. "Without
NumPy" replaces the path finder on sys.meta_path with one that cannot see numpy, as if it were not installed:
``import numpy`` raises ModuleNotFoundError and ``importlib.util.find_spec("numpy")`` is None.
"""
import subprocess
import sys

import pytest
from helpers import package_parent

WITHOUT_NUMPY = '''
import sys
from importlib.machinery import PathFinder


class _PathFinderWithoutNumpy:
    """sys.meta_path's PathFinder, blind to numpy and its distribution metadata."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            return None
        return PathFinder.find_spec(name, path, target)

    @staticmethod
    def find_distributions(*args, **kwargs):
        for dist in PathFinder.find_distributions(*args, **kwargs):
            if (dist.metadata["Name"] or "").lower() != "numpy":
                yield dist

    @staticmethod
    def invalidate_caches():
        PathFinder.invalidate_caches()


sys.meta_path[sys.meta_path.index(PathFinder)] = _PathFinderWithoutNumpy()
'''

NUMPY_IS_MISSING = '''
import importlib.util
assert importlib.util.find_spec("numpy") is None
try:
    import numpy
except ModuleNotFoundError as exc:
    assert exc.name == "numpy", exc
else:
    raise AssertionError("numpy imported")
'''

# Every op and out= overload on meta tensors and under FakeTensorMode, against the CPU kernels' shape and
# dtype; then the Python API, with its backward, under FakeTensorMode.
FAKE_KERNELS_WORK = '''
import npu_loss_ops  # first: an earlier `import torch` would show torch's own warning

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

ops = torch.ops.npu_loss


def run(make):
    results = {}
    for r in (0, 1, 2):
        x, t, g = make((3, 4)), make((4,)), make((3, 4) if r == 0 else ())
        res = {
            "smooth_l1_loss": ops.smooth_l1_loss.default(x, t, r, 0.5),
            "l1_loss": ops.l1_loss.default(x, t, r),
            "kl_div": ops.kl_div.default(x, t, r, log_target=False),
            "smooth_l1_loss_backward": ops.smooth_l1_loss_backward.default(g, x, t, r, 0.5),
            "l1_loss_backward": ops.l1_loss_backward.default(g, x, t, r),
            "kl_div_target_backward": ops.kl_div_target_backward.default(g, x, t, r, False),
        }
        res["smooth_l1_loss_backward.grad_input"] = ops.smooth_l1_loss_backward.grad_input(
            g, x, t, r, 0.5, grad_input=make(res["smooth_l1_loss_backward"].shape))
        res["l1_loss_backward.grad_input"] = ops.l1_loss_backward.grad_input(
            g, x, t, r, grad_input=make(res["l1_loss_backward"].shape))
        res["kl_div_target_backward.grad_target"] = ops.kl_div_target_backward.grad_target(
            g, x, t, r, False, grad_target=make(res["kl_div_target_backward"].shape))
        for name, value in res.items():
            results[f"{name}, reduction {r}"] = value
    return results


def signature(value):
    return tuple(value.shape), value.dtype


cpu = run(lambda shape: torch.rand(shape))
meta = run(lambda shape: torch.empty(shape, device="meta"))
with FakeTensorMode():
    fake = run(lambda shape: torch.empty(shape))
assert len(cpu) == 27
for key, expected in cpu.items():
    assert meta[key].device.type == "meta", key
    assert isinstance(fake[key], FakeTensor), key
    assert signature(meta[key]) == signature(expected), (key, signature(meta[key]), signature(expected))
    assert signature(fake[key]) == signature(expected), (key, signature(fake[key]), signature(expected))

with FakeTensorMode():
    x = torch.empty(3, 4, requires_grad=True)
    t = torch.empty(3, 4, requires_grad=True)
    loss = (
        npu_loss_ops.smooth_l1_loss(x, t, beta=0.5)
        + npu_loss_ops.L1Loss()(x, t)
        + npu_loss_ops.kl_div(x, t, reduction="batchmean")
    )
    assert loss.shape == () and isinstance(loss, FakeTensor)
    loss.backward()
    assert x.grad.shape == (3, 4) and t.grad.shape == (3, 4)
'''


def _python(code, *, without_numpy, warnings_are_errors=True):
    """Runs `code` in a fresh interpreter (with -W error by default) from the directory the package under
    test is imported from, so that it imports that package (an installed wheel's too)."""
    options = ["-W", "error"] if warnings_are_errors else []
    return subprocess.run(
        [sys.executable, *options, "-c", (WITHOUT_NUMPY if without_numpy else "") + code],
        cwd=package_parent(), capture_output=True, text=True, timeout=600,
    )


def _assert_clean(result):
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    assert result.stdout.strip().endswith("ok"), result.stdout


@pytest.mark.parametrize("without_numpy", [False, True], ids=["with-numpy", "without-numpy"])
def test_import_is_quiet(without_numpy):
    if not without_numpy:
        pytest.importorskip("numpy")
    code = "import npu_loss_ops\n"
    code += NUMPY_IS_MISSING if without_numpy else "import numpy\n"
    _assert_clean(_python(code + "print('ok')\n", without_numpy=without_numpy))


@pytest.mark.parametrize("without_numpy", [False, True], ids=["with-numpy", "without-numpy"])
def test_import_keeps_the_warning_filters_torch_adds(without_numpy):
    """torch's import adds warning filters of its own; after the package's import the filters are exactly
    those of a plain `import torch`."""
    if not without_numpy:
        pytest.importorskip("numpy")
    show = "import warnings\nprint(repr(warnings.filters))\n"
    plain = _python("import torch\n" + show, without_numpy=without_numpy, warnings_are_errors=False)
    ours = _python("import npu_loss_ops\n" + show, without_numpy=without_numpy, warnings_are_errors=False)
    assert plain.returncode == 0 and ours.returncode == 0, plain.stderr + ours.stderr
    assert ours.stdout == plain.stdout


def test_torch_itself_warns_without_numpy():
    """What the package's import keeps quiet: torch 2.13's own import warns once without NumPy. This also
    shows that the simulated environment reproduces that warning."""
    result = _python("import torch\n", without_numpy=True)
    assert result.returncode != 0
    assert "UserWarning: Failed to initialize NumPy: No module named 'numpy'" in result.stderr, result.stderr


def test_fake_kernels_work_without_numpy():
    _assert_clean(_python(FAKE_KERNELS_WORK + NUMPY_IS_MISSING + "print('ok')\n", without_numpy=True))
