"""npu_loss_ops: loss functions and their gradients as torch.ops.npu_loss.* ops.

On an Ascend NPU (torch_npu) the gradients run on the CANN aclnn kernels; everywhere else native CPU
kernels (or, on other devices, a composite of ATen ops) give the same numbers and the same errors.
"""
import importlib.util
import os
import sys
import warnings
from typing import Any, TypedDict, cast


def _import_torch() -> None:
    """Imports torch without passing on its warning about a missing NumPy.

    Without NumPy, torch's own import warns "Failed to initialize NumPy: No module named 'numpy'": importing
    torch.export (from torch/__init__.py) imports torch/_subclasses/functional_tensor.py, whose class body
    calls torch.device("cpu"), and that call's argument parsing tries once to load NumPy's C API (to check
    for a NumPy integer). This package never needs NumPy, so its import ignores that one warning; an
    `import torch` of the user's own, before this one, still shows it, and a NumPy that is installed but
    fails to load warns as before. warnings.catch_warnings would also drop the filters torch's import adds,
    so the filter list is restored by hand: torch's additions in front, as its import put them.
    """
    saved = list(warnings.filters)
    warnings.filterwarnings(
        "ignore", message="Failed to initialize NumPy: No module named 'numpy", category=UserWarning
    )
    ours = warnings.filters[0]
    try:
        import torch  # noqa: F401
    finally:
        # A list that the warnings module edits in place (typeshed calls it a Sequence).
        filters = cast("list[Any]", warnings.filters)
        added = [f for f in filters if f != ours and f not in saved]
        filters[:] = added + saved


_import_torch()
import torch  # noqa: E402  (libtorch must be loaded before _C)

from .version import __version__  # noqa: E402


def _same_torch_abi(built_with: str, installed: str) -> bool:
    """True when an extension built against torch `built_with` runs under torch `installed`: the same version,
    or the same release as another of the builds that export one C++ ABI to it: the CPU build ("+cpu"), the
    CUDA builds ("+cu130") and the build without a label (PyPI's: CUDA on x86-64, CPU on aarch64). They
    share every header the extension compiles against and every symbol it imports (docs/usage.md,
    "Deploying", has the check), so a wheel built against 2.13.0+cpu, which requires torch==2.13.0, runs under
    each. Any other label (ROCm, XPU, a source build) needs the exact version."""
    if built_with == installed:
        return True
    (release, _, label), (other_release, _, other_label) = built_with.partition("+"), installed.partition("+")
    return release == other_release and _shares_abi(label) and _shares_abi(other_label)


def _shares_abi(label: str) -> bool:
    return label in ("", "cpu") or (label.startswith("cu") and label[2:].isdigit())


def _check_torch_version(built_with: str | None, installed: str) -> None:
    """The compiled extension only works with the torch it was built against (or a build of that release
    with the same C++ ABI, _same_torch_abi)."""
    if built_with is not None and not _same_torch_abi(built_with, installed):
        raise ImportError(
            f"npu_loss_ops was built against torch {built_with}, but torch {installed} is installed. "
            "Rebuild it against the installed torch: "
            "pip install --no-build-isolation --no-deps --force-reinstall <path to npu_loss_ops>"
        )


_BUILT_WITH_TORCH: str | None
_BUILT_WITH_TORCH_NPU: str | None
_NPU_TESTED: str | None
try:
    from ._build_torch import TORCH_VERSION as _BUILT_WITH_TORCH
except ImportError:  # a source checkout that was never built
    _BUILT_WITH_TORCH = None
try:  # written by setup.py with the extension; absent from a source checkout
    from ._build_torch import NPU_TESTED as _NPU_TESTED
    from ._build_torch import TORCH_NPU_VERSION as _BUILT_WITH_TORCH_NPU
except ImportError:
    _BUILT_WITH_TORCH_NPU = _NPU_TESTED = None
_check_torch_version(_BUILT_WITH_TORCH, torch.__version__)


def _missing_extension_error(package_dir: str) -> ImportError:
    """The error for a package folder without its compiled _C: most often the repository's source folder,
    which Python finds first when run from the repository root, ahead of the installed package."""
    import glob

    installed = [
        os.path.join(path, "npu_loss_ops")
        for path in sys.path[1:]
        if path and os.path.abspath(path) != os.path.dirname(package_dir)
        and glob.glob(os.path.join(path, "npu_loss_ops", "_C.*"))
    ]
    where = f" The installed copy is in {installed[0]}." if installed else ""
    return ImportError(
        f"npu_loss_ops was imported from {package_dir}, which has no compiled extension (_C): a source folder "
        f"that was never built in place.{where} Python looks in the current directory first, so run from "
        "outside the repository to use the installed package, or build in place here with "
        "`pip install --no-build-isolation -e .` (README, 'Install')."
    )


# The extension must be loaded before any torch.library registration refers to its ops.
try:
    from . import _C  # type: ignore[attr-defined]  # noqa: E402  (compiled: no Python source to check)
except ImportError as _exc:
    _package_dir = os.path.dirname(os.path.abspath(__file__))
    if not any(name.startswith("_C.") for name in os.listdir(_package_dir)):
        raise _missing_extension_error(_package_dir) from None
    raise


class _NpuStatus(TypedDict):
    available: bool
    reason: str


_npu_status: _NpuStatus = {"available": False, "reason": "not checked"}


def _load_npu_kernels() -> None:
    """Import torch_npu if it is installed and load the aclnn kernels; never fail the import."""
    if importlib.util.find_spec("torch_npu") is None:
        _npu_status["reason"] = "torch_npu is not installed"
        return
    try:
        # Untyped where installed, absent elsewhere: the ignore is in the code, so mypy run from anywhere agrees.
        import torch_npu  # type: ignore[import-not-found, import-untyped, unused-ignore]  # noqa: F401
    except Exception as exc:  # without CANN torch_npu raises more than ImportError
        _npu_status["reason"] = f"import torch_npu failed: {type(exc).__name__}: {exc}"
        return
    if importlib.util.find_spec(f"{__name__}._C_npu") is None:
        _unloadable_npu_kernels("npu_loss_ops was built without the NPU kernels (_C_npu)")
        return
    try:
        from . import _C_npu  # type: ignore[attr-defined]  # noqa: F401  (compiled)
    except Exception as exc:
        _unloadable_npu_kernels(f"loading _C_npu failed: {type(exc).__name__}: {exc}")
        return
    _npu_status["available"] = True
    _npu_status["reason"] = "aclnn kernels registered for the NPU"


def _npu_device_present() -> bool:
    try:
        return bool(torch.npu.is_available())  # type: ignore[attr-defined]  # torch_npu adds torch.npu
    except Exception:
        return False


def _unloadable_npu_kernels(reason: str) -> None:
    """Record why the aclnn kernels are off; with an NPU present that is a broken install: say so once."""
    _npu_status["reason"] = reason
    if _npu_device_present():
        warnings.warn(
            f"npu_loss_ops: an NPU is present but its aclnn kernels are not in use ({reason}); "
            "every op runs the composite fallback on the NPU. Rebuild npu_loss_ops with torch_npu installed.",
            RuntimeWarning,
            stacklevel=3,
        )


_load_npu_kernels()

from . import _dtensor, _fake  # noqa: E402
from .functional import (fused_linear_jsd_loss, generalized_jsd_loss, huber_loss, kl_div, l1_loss,  # noqa: E402
                         mse_loss, smooth_l1_loss, sparse_jsd_loss, fused_linear_sparse_jsd_loss)
from .modules import (FusedLinearJSDLoss, HuberLoss, JSDLoss, KLDivLoss, L1Loss, MSELoss, SmoothL1Loss,  # noqa: E402
                      SparseJSDLoss, FusedLinearSparseJSDLoss)
from ._enable import disable, enable, is_enabled  # noqa: E402  (routes torch's own losses here; off at import)

# The row losses' fake kernels (Python: 'none' with labels has a size only the data tells).
_fake.register()
# DTensor's sharding rules, registered when torch.distributed.tensor is imported (importing it here would
# double the import time).
_dtensor.install()


def npu_kernels_available() -> bool:
    """True when the aclnn NPU kernels are registered (torch_npu imported and _C_npu loaded)."""
    return _npu_status["available"]


def build_info() -> dict[str, Any]:
    """What this installation runs: CPU kernel ISA, OpenMP, the torch it was built against (its full
    version, e.g. '2.13.0+cpu': torch.__version__, or a build of that release with the same C++ ABI, or the
    import fails), the torch_npu its NPU kernels were built against (None without them) and how far they
    were tested on that release, and the NPU kernels' status."""
    info: dict[str, Any] = dict(_C.build_info())
    info["torch_version"] = _BUILT_WITH_TORCH
    info["torch_npu_version"] = _BUILT_WITH_TORCH_NPU
    info["npu_tested"] = _NPU_TESTED
    info["version"] = __version__
    info["npu_kernels"] = _npu_status["available"]
    info["npu_reason"] = _npu_status["reason"]
    if _npu_status["available"]:
        from . import _C_npu  # type: ignore[attr-defined]  # compiled

        torch.npu.init()  # type: ignore[attr-defined]  # aclrtGetSocName needs an initialised device
        info["npu_soc"] = _C_npu.soc_name()
        info["npu_chip"] = _C_npu.chip_family()
    return info


__all__ = [
    "__version__",
    "smooth_l1_loss",
    "huber_loss",
    "l1_loss",
    "kl_div",
    "mse_loss",
    "generalized_jsd_loss",
    "fused_linear_jsd_loss",
    "sparse_jsd_loss",
    "fused_linear_sparse_jsd_loss",
    "SmoothL1Loss",
    "HuberLoss",
    "L1Loss",
    "KLDivLoss",
    "MSELoss",
    "JSDLoss",
    "FusedLinearJSDLoss",
    "SparseJSDLoss",
    "FusedLinearSparseJSDLoss",
    "enable",
    "disable",
    "is_enabled",
    "npu_kernels_available",
    "build_info",
]
