"""The reduction strings of the Python API and the ops' ``int reduction`` argument.

The ``torch.ops.npu_loss`` ops take ATen's Reduction enum (``at::Reduction``: none = 0, mean = 1, sum = 2);
the Python API takes ``torch.nn.functional``'s strings. :func:`get_enum` is the one mapping between the two.
It is a chain of comparisons with literal results because TorchScript compiles it and can read neither a
module-level dict nor a module-level int; :data:`REDUCTION_ENUMS` is the same mapping as a table, built
from it.
"""
__all__ = ["get_enum", "REDUCTION_ENUMS"]


def get_enum(reduction: str) -> int:
    """The ops' enum for a reduction string: ``ValueError`` unless it is ``'none'``, ``'mean'`` or ``'sum'``.

    KL's ``'batchmean'`` is not an op reduction: :func:`npu_loss_ops.functional.kl_div` maps it to ``'sum'``
    and divides by the batch size itself.
    """
    if reduction == "none":
        return 0
    if reduction == "mean":
        return 1
    if reduction == "sum":
        return 2
    raise ValueError(f"{reduction} is not a valid value for reduction")


REDUCTION_ENUMS: dict[str, int] = {name: get_enum(name) for name in ("none", "mean", "sum")}
