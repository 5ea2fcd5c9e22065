"""torch.nn-style loss modules backed by the ``torch.ops.npu_loss`` ops.

Drop-ins for :class:`torch.nn.SmoothL1Loss`, :class:`torch.nn.HuberLoss`, :class:`torch.nn.L1Loss`,
:class:`torch.nn.KLDivLoss` and :class:`torch.nn.MSELoss`: same constructor arguments, attributes and legacy
``size_average``/``reduce`` handling (they subclass torch's ``_Loss``), with ``forward`` calling
:mod:`npu_loss_ops.functional`. They compile with ``torch.jit.script``, alone or inside a model.
:class:`JSDLoss` is the distillation loss :func:`npu_loss_ops.functional.generalized_jsd_loss` as a module.
"""
from typing import Any, TypedDict

import torch
from torch import Tensor
from torch.nn import Module
from torch.nn.modules.loss import _Loss

from . import _vocab_parallel, functional

__all__ = ["SmoothL1Loss", "HuberLoss", "L1Loss", "KLDivLoss", "MSELoss", "JSDLoss", "FusedLinearJSDLoss",
           "SparseJSDLoss", "FusedLinearSparseJSDLoss"]


class _LossOfReduction(_Loss):
    """A loss module whose only arguments are the reduction and the legacy pair (L1Loss, MSELoss): torch.nn's
    constructor, typed."""

    def __init__(
        self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean"
    ) -> None:
        super().__init__(size_average, reduce, reduction)


class SmoothL1Loss(_Loss):
    """Creates a criterion that uses a squared term if the absolute element-wise error falls below
    ``beta`` and an L1 term otherwise.

    A drop-in for :class:`torch.nn.SmoothL1Loss`; see :func:`npu_loss_ops.functional.smooth_l1_loss`.
    With ``d = input - target``, the unreduced loss is, elementwise::

        l = 0.5 * d**2 / beta    if |d| < beta
        l = |d| - 0.5 * beta     otherwise

    then its mean (``reduction='mean'``) or sum (``'sum'``), or the elementwise loss itself (``'none'``).
    ``beta == 0`` gives exactly the L1 loss.

    Args:
        size_average (bool, optional): Deprecated (see ``reduction``). If given, together with ``reduce``
            it overrides ``reduction``. Default: ``None``
        reduce (bool, optional): Deprecated (see ``reduction``). Default: ``None``
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'sum'``. Default: ``'mean'``
        beta (float, optional): Threshold between the squared and the L1 term; must be non-negative.
            Default: ``1.0``

    Attributes:
        reduction (str): the reduction in use (after the legacy arguments are resolved).
        beta (float): the threshold.

    Shape:
        - Input: ``(*)``, where ``*`` means any number of dimensions up to 8.
        - Target: ``(*)``, same shape as the input.
        - Output: scalar. If ``reduction`` is ``'none'``, then ``(*)``, same shape as the input.

    Raises:
        ValueError: when called, for an unknown ``reduction`` (as in PyTorch) or a negative or NaN ``beta``
            (PyTorch raises ``RuntimeError``); as in PyTorch, the constructor checks neither.
        TypeError: when called, for a complex operand or two integral ones (PyTorch raises
            ``NotImplementedError``, a ``RuntimeError``); see :func:`npu_loss_ops.functional.smooth_l1_loss`.
        RuntimeError: when called, for an operand with more than 8 dimensions (PyTorch has no such limit).

    Example::

        >>> import torch
        >>> from npu_loss_ops.modules import SmoothL1Loss
        >>> loss = SmoothL1Loss(beta=0.5)
        >>> loss(torch.tensor([0.25, 2.0]), torch.tensor([0.0, 0.0]))
        tensor(0.9062)
    """

    __constants__ = ["reduction"]

    def __init__(self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
                 beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """Runs the forward pass."""
        return functional.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(_Loss):
    """Creates a criterion that uses a squared term if the absolute element-wise error falls below
    ``delta`` and a delta-scaled L1 term otherwise.

    A drop-in for :class:`torch.nn.HuberLoss`; see :func:`npu_loss_ops.functional.huber_loss`. With
    ``d = input - target``, the unreduced loss is, elementwise::

        l = 0.5 * d**2                     if |d| < delta
        l = delta * (|d| - 0.5 * delta)    otherwise

    then its mean (``reduction='mean'``) or sum (``'sum'``), or the elementwise loss itself (``'none'``).

    Args:
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'sum'``. Default: ``'mean'``
        delta (float, optional): The threshold; must be positive (``inf`` allowed). Default: ``1.0``

    Raises:
        TypeError: at construction, for a ``delta`` that is not a float or int (as torch 2.13's).
        ValueError: when called, for an unknown ``reduction`` or a ``delta`` that is not > 0 (PyTorch raises
            ``RuntimeError`` for the latter).

    Attributes:
        reduction (str): the reduction in use.
        delta (float): the threshold.
    """

    __constants__ = ["reduction", "delta"]

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        # torch.nn.HuberLoss's own check (torch 2.13): a delta that is not a real number fails here, not at
        # the first call.
        if not isinstance(delta, (float, int)):
            raise TypeError(f"delta must be a float or int, got: {type(delta)}")
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """The loss of ``input`` against ``target``."""
        return functional.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class L1Loss(_LossOfReduction):
    """Creates a criterion that measures the mean absolute error (MAE) between each element in the input
    and the target.

    A drop-in for :class:`torch.nn.L1Loss`; see :func:`npu_loss_ops.functional.l1_loss`. The unreduced
    loss is, elementwise, ``l = |input - target|``; then its mean (``reduction='mean'``) or sum
    (``'sum'``), or the elementwise loss itself (``'none'``).

    Args:
        size_average (bool, optional): Deprecated (see ``reduction``). If given, together with ``reduce``
            it overrides ``reduction``. Default: ``None``
        reduce (bool, optional): Deprecated (see ``reduction``). Default: ``None``
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'sum'``. Default: ``'mean'``

    Attributes:
        reduction (str): the reduction in use (after the legacy arguments are resolved).

    Shape:
        - Input: ``(*)``, where ``*`` means any number of dimensions up to 8.
        - Target: ``(*)``, same shape as the input.
        - Output: scalar. If ``reduction`` is ``'none'``, then ``(*)``, same shape as the input.

    Raises:
        ValueError: when called, for an unknown ``reduction`` (as in PyTorch, the constructor does not
            check it).
        TypeError: when called, for a bool operand or ``'mean'`` of two integer ones (PyTorch raises
            ``RuntimeError``), or a complex operand (PyTorch returns a real loss); see
            :func:`npu_loss_ops.functional.l1_loss`.
        RuntimeError: when called, for an operand with more than 8 dimensions (PyTorch has no such limit).

    Example::

        >>> import torch
        >>> from npu_loss_ops.modules import L1Loss
        >>> loss = L1Loss(reduction="sum")
        >>> loss(torch.tensor([1.0, -2.0, 3.5]), torch.tensor([0.0, 0.0, 0.0]))
        tensor(6.5000)
    """

    __constants__ = ["reduction"]

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """Runs the forward pass."""
        return functional.l1_loss(input, target, reduction=self.reduction)


class KLDivLoss(_Loss):
    """The Kullback-Leibler divergence loss.

    A drop-in for :class:`torch.nn.KLDivLoss`; see :func:`npu_loss_ops.functional.kl_div`. ``input`` is
    expected in log space; ``target`` too if ``log_target`` is ``True``. The unreduced loss is,
    elementwise::

        l = target * (log(target) - input)       if not log_target (0 where target == 0)
        l = exp(target) * (target - input)       if log_target

    then reduced: ``'batchmean'`` divides the sum by ``input.size(0)`` (the true KL divergence of a
    batch), ``'sum'`` sums, ``'mean'`` divides the sum by the element count, ``'none'`` keeps every element.

    One deliberate difference from PyTorch: with ``log_target=False`` the gradient w.r.t. ``target`` is
    exactly 0 where ``target == 0``, where PyTorch's autograd gives NaN.

    .. warning::
        ``reduction='mean'`` does not return the true KL divergence value; use ``'batchmean'``.

    Args:
        size_average (bool, optional): Deprecated (see ``reduction``). If given, together with ``reduce``
            it overrides ``reduction``. Default: ``None``
        reduce (bool, optional): Deprecated (see ``reduction``). Default: ``None``
        reduction (str, optional): ``'none'`` | ``'batchmean'`` | ``'sum'`` | ``'mean'``. Default: ``'mean'``
        log_target (bool, optional): Whether ``target`` is given in log space. Default: ``False``

    Attributes:
        reduction (str): the reduction in use (after the legacy arguments are resolved).
        log_target (bool): whether ``target`` is in log space.

    Shape:
        - Input: ``(*)``, where ``*`` means any number of dimensions up to 8.
        - Target: ``(*)``, same shape as the input.
        - Output: scalar by default. If ``reduction`` is ``'none'``, then ``(*)``, same shape as the input.

    Raises:
        ValueError: when called, for an unknown ``reduction`` (as in PyTorch, the constructor does not
            check it).
        TypeError: when called, for an integral, bool or complex operand (PyTorch raises ``RuntimeError``).
        RuntimeError: when called, for an operand with more than 8 dimensions (PyTorch has no such limit).

    Example::

        >>> import torch
        >>> from npu_loss_ops.modules import KLDivLoss
        >>> kl_loss = KLDivLoss(reduction="batchmean")
        >>> input = torch.tensor([[0.25, 0.75], [0.5, 0.5]]).log()   # model output, log-probabilities
        >>> target = torch.tensor([[0.5, 0.5], [0.5, 0.5]])          # probabilities
        >>> kl_loss(input, target)
        tensor(0.0719)
        >>> KLDivLoss(reduction="batchmean", log_target=True)(input, target.log())
        tensor(0.0719)
    """

    __constants__ = ["reduction"]

    def __init__(self, size_average: bool | None = None, reduce: bool | None = None, reduction: str = "mean",
                 log_target: bool = False) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """Runs the forward pass."""
        return functional.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class MSELoss(_LossOfReduction):
    """Creates a criterion that measures the mean squared error (squared L2 norm) between each element in
    the input and the target.

    A drop-in for :class:`torch.nn.MSELoss`; see :func:`npu_loss_ops.functional.mse_loss`. The unreduced
    loss is, elementwise, ``l = (input - target) ** 2``; then its mean (``reduction='mean'``) or sum
    (``'sum'``), or the elementwise loss itself (``'none'``).

    Args:
        size_average (bool, optional): Deprecated (see ``reduction``). Default: ``None``
        reduce (bool, optional): Deprecated (see ``reduction``). Default: ``None``
        reduction (str, optional): ``'none'`` | ``'mean'`` | ``'sum'``. Default: ``'mean'``
    """

    __constants__ = ["reduction"]

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        """Runs the forward pass."""
        return functional.mse_loss(input, target, reduction=self.reduction)


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """A tensor on the meta device: the modules check their arguments by calling their function on such tensors
    (nothing is computed), so that they apply the function's rules, not a copy of them."""
    return torch.empty(shape, dtype=dtype, device="meta")


# The logit transform's keywords, as both modules keep and pass them (functional.generalized_jsd_loss).
_TRANSFORM = ("student_logit_scale", "teacher_logit_scale", "student_softcap", "teacher_softcap")
_IDENTITY = (1.0, 1.0, None, None)


class _Transform(TypedDict):
    student_logit_scale: float
    teacher_logit_scale: float
    student_softcap: float | None
    teacher_softcap: float | None


def _transform_of(module: "JSDLoss | FusedLinearJSDLoss") -> _Transform:
    return _Transform(student_logit_scale=module.student_logit_scale, teacher_logit_scale=module.teacher_logit_scale,
                      student_softcap=module.student_softcap, teacher_softcap=module.teacher_softcap)


def _entropy_repr(module: "JSDLoss | FusedLinearJSDLoss | FusedLinearSparseJSDLoss") -> str:
    return ", return_entropy=True" if module.return_entropy else ""


def _transform_repr(module: "JSDLoss | FusedLinearJSDLoss") -> str:
    """The transform's keywords that differ from their defaults, for extra_repr."""
    return "".join(f", {name}={getattr(module, name)}" for name, default in zip(_TRANSFORM, _IDENTITY)
                   if getattr(module, name) != default)


def _group(module: str, group: Any) -> Any:
    """A module's vocab_parallel_group, checked at construction (functional.generalized_jsd_loss's keyword)."""
    if group is not None:
        _vocab_parallel.check_group(module, group)
    return group


class JSDLoss(Module):
    """The generalized Jensen-Shannon divergence between a student's and a teacher's logits:
    :func:`npu_loss_ops.functional.generalized_jsd_loss` (TRL's ``GKDTrainer.generalized_jsd_loss``) as a
    module.

    Args:
        beta (float): in ``[0, 1]``; 0 is KL(teacher || student), 1 KL(student || teacher). Default: ``0.5``
        temperature (float): ``> 0``. Default: ``1.0``
        ignore_index (int): the label of the rows left out. Default: ``-100``
        reduction (str): ``'batchmean'``, ``'sum'``, ``'mean'`` or ``'none'``. Default: ``'batchmean'``
        student_logit_scale, teacher_logit_scale (float): ``> 0``, each side's logits times it. Default: ``1.0``
        student_softcap, teacher_softcap (float, optional): ``> 0``, each side's softcap after its scale.
            Default: ``None``
        return_entropy (bool): the call returns ``(loss, entropy)``, the student's entropy per row. Default:
            ``False``
        vocab_parallel_group (ProcessGroup, optional): the logits' vocabulary split over this group, each rank its
            slice (docs/usage.md, "Distributed distillation"). Default: ``None``

    Raises:
        TypeError, ValueError: at construction, as the function raises them for the same arguments (it checks them,
            on meta tensors): a scalar of another type (a str, None or a bool where a number is expected), a
            ``beta`` outside ``[0, 1]``, a ``temperature``, scale or softcap that is not ``> 0`` or an unknown
            ``reduction``.

    Called as ``loss(student_logits, teacher_logits, labels=None, num_items_in_batch=None)``.
    """

    def __init__(self, beta: float = 0.5, temperature: float = 1.0, ignore_index: int = -100,
                 reduction: str = "batchmean", *, student_logit_scale: float = 1.0, teacher_logit_scale: float = 1.0,
                 student_softcap: float | None = None, teacher_softcap: float | None = None,
                 return_entropy: bool = False, vocab_parallel_group: Any = None) -> None:
        super().__init__()
        self.vocab_parallel_group = _group("JSDLoss", vocab_parallel_group)
        # The function's own checks (types, then the op's declared ranges), on meta tensors: nothing is computed.
        functional.generalized_jsd_loss(_meta(1, 1), _meta(1, 1), None, beta, temperature, reduction,
                                        ignore_index=ignore_index, student_logit_scale=student_logit_scale,
                                        teacher_logit_scale=teacher_logit_scale, student_softcap=student_softcap,
                                        teacher_softcap=teacher_softcap, return_entropy=return_entropy)
        self.return_entropy = return_entropy
        self.beta = beta
        self.temperature = temperature
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.student_logit_scale = student_logit_scale
        self.teacher_logit_scale = teacher_logit_scale
        self.student_softcap = student_softcap
        self.teacher_softcap = teacher_softcap

    def forward(self, student_logits: Tensor, teacher_logits: Tensor, labels: Tensor | None = None,
                num_items_in_batch: int | float | Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """The loss of the student's logits against the teacher's (and the student's entropy per row, with
        ``return_entropy``)."""
        return functional.generalized_jsd_loss(
            student_logits, teacher_logits, labels, self.beta, self.temperature, self.reduction, num_items_in_batch,
            ignore_index=self.ignore_index, **_transform_of(self), return_entropy=self.return_entropy,
            vocab_parallel_group=self.vocab_parallel_group)

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, temperature={self.temperature}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}{_transform_repr(self)}{_entropy_repr(self)}")




class FusedLinearJSDLoss(Module):
    """The generalized JSD from hidden states and ``lm_head`` weights, without the logits:
    :func:`npu_loss_ops.functional.fused_linear_jsd_loss` as a module (Liger-Kernel's
    ``LigerFusedLinearJSDLoss``'s role, with TRL's defaults for the weights: hard 0.0, soft 1.0).

    Args:
        beta (float): in ``[0, 1]``. Default: ``0.5``
        temperature (float): ``> 0``. Default: ``1.0``
        ignore_index (int): Default: ``-100``
        reduction (str): ``'batchmean'``, ``'sum'`` or ``'mean'``. Default: ``'batchmean'``
        weight_hard_loss (float): the cross entropy's weight, ``>= 0``. Default: ``0.0``
        weight_soft_loss (float): the JSD's weight, ``>= 0``. Default: ``1.0``
        chunk_size (int, optional): rows per chunk; ``None`` sizes it by bytes. Default: ``None``
        student_logit_scale, teacher_logit_scale, student_softcap, teacher_softcap: the logit transform, keyword
            only, as :class:`JSDLoss` takes it.
        return_entropy (bool): the call returns ``(loss, entropy)``, the student's entropy per row. Default:
            ``False``
        vocab_parallel_group (ProcessGroup, optional): both weights' rows split over this group, each rank its
            contiguous rows; the hidden states' gradient is then each rank's partial sum (docs/usage.md,
            "Distributed distillation"). Default: ``None``

    Raises:
        TypeError, ValueError: at construction, as the function raises them for the same arguments (it checks them,
            on meta tensors): a scalar of another type (a str, None or a bool where a number is expected), a
            ``beta`` outside ``[0, 1]``, a ``temperature`` that is not ``> 0``, a negative weight, a ``reduction``
            outside the three or a ``chunk_size`` below 1.

    Called as ``loss(student_input, student_weight, teacher_input, teacher_weight, labels=None,
    student_bias=None, teacher_bias=None)``.
    """

    def __init__(self, beta: float = 0.5, temperature: float = 1.0, ignore_index: int = -100,
                 reduction: str = "batchmean", weight_hard_loss: float = 0.0, weight_soft_loss: float = 1.0,
                 chunk_size: int | None = None, *, student_logit_scale: float = 1.0, teacher_logit_scale: float = 1.0,
                 student_softcap: float | None = None, teacher_softcap: float | None = None,
                 return_entropy: bool = False, vocab_parallel_group: Any = None) -> None:
        super().__init__()
        self.vocab_parallel_group = _group("FusedLinearJSDLoss", vocab_parallel_group)
        # The function's own checks, on meta tensors (labels given: a hard loss needs them).
        functional.fused_linear_jsd_loss(
            _meta(1, 1), _meta(1, 1), _meta(1, 1), _meta(1, 1), _meta(1, dtype=torch.long), beta=beta,
            temperature=temperature, ignore_index=ignore_index, reduction=reduction, weight_hard_loss=weight_hard_loss,
            weight_soft_loss=weight_soft_loss, chunk_size=chunk_size, student_logit_scale=student_logit_scale,
            teacher_logit_scale=teacher_logit_scale, student_softcap=student_softcap, teacher_softcap=teacher_softcap,
            return_entropy=return_entropy)
        self.return_entropy = return_entropy
        self.student_logit_scale = student_logit_scale
        self.teacher_logit_scale = teacher_logit_scale
        self.student_softcap = student_softcap
        self.teacher_softcap = teacher_softcap
        self.beta = beta
        self.temperature = temperature
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.weight_hard_loss = weight_hard_loss
        self.weight_soft_loss = weight_soft_loss
        self.chunk_size = chunk_size

    def forward(self, student_input: Tensor, student_weight: Tensor, teacher_input: Tensor, teacher_weight: Tensor,
                labels: Tensor | None = None, student_bias: Tensor | None = None,
                teacher_bias: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """The loss of the student against the teacher (and the student's entropy per row, with
        ``return_entropy``)."""
        result = functional.fused_linear_jsd_loss(
            student_input, student_weight, teacher_input, teacher_weight, labels, student_bias=student_bias,
            teacher_bias=teacher_bias, beta=self.beta, temperature=self.temperature, ignore_index=self.ignore_index,
            reduction=self.reduction, weight_hard_loss=self.weight_hard_loss, weight_soft_loss=self.weight_soft_loss,
            chunk_size=self.chunk_size, **_transform_of(self), return_entropy=self.return_entropy,
            vocab_parallel_group=self.vocab_parallel_group)
        if self.return_entropy:
            assert isinstance(result, tuple)
            return result[0], result[1]
        assert isinstance(result, Tensor)
        return result

    def extra_repr(self) -> str:
        return (f"beta={self.beta}, temperature={self.temperature}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}, weight_hard_loss={self.weight_hard_loss}, "
                f"weight_soft_loss={self.weight_soft_loss}, chunk_size={self.chunk_size}{_transform_repr(self)}"
                f"{_entropy_repr(self)}")


class SparseJSDLoss(Module):
    """The generalized JSD between a student's logits and a served teacher's top-k log-probabilities:
    :func:`npu_loss_ops.functional.sparse_jsd_loss` (TRL's ``ServerDistillationTrainer``) as a module.

    Args:
        beta (float): in ``[0, 1]``; 0 is forward KL (the teacher's top-k), 1 reverse KL. Default: ``0.0``
        temperature (float): ``> 0``; divides the student's logits. Default: ``1.0``
        add_tail (bool): the tail bucket (``True``) or renormalization over the support. Default: ``True``
        ignore_index (int): the label of the rows left out. Default: ``-100``
        reduction (str): ``'batchmean'``, ``'sum'``, ``'mean'`` or ``'none'``. Default: ``'batchmean'``
        student_logit_scale (float), student_softcap (float, optional): the student's logit transform.
        vocab_parallel_group (ProcessGroup, optional): the student's vocabulary split over this group, each rank its
            slice of the logits, the teacher's ids global (docs/usage.md, "Distributed distillation"). Default:
            ``None``

    Raises:
        TypeError, ValueError: at construction, as the function raises them for the same arguments.

    Called as ``loss(student_logits, teacher_logprobs, teacher_token_ids, labels=None, support_mask=None,
    num_items_in_batch=None)``.
    """

    def __init__(self, beta: float = 0.0, temperature: float = 1.0, add_tail: bool = True, ignore_index: int = -100,
                 reduction: str = "batchmean", *, student_logit_scale: float = 1.0,
                 student_softcap: float | None = None, vocab_parallel_group: Any = None) -> None:
        super().__init__()
        self.vocab_parallel_group = _group("SparseJSDLoss", vocab_parallel_group)
        # The function's own checks (types, then the op's declared ranges), on meta tensors: nothing is computed.
        functional.sparse_jsd_loss(_meta(1, 1), _meta(1, 1), torch.zeros(1, 1, dtype=torch.long, device="meta"),
                                   beta=beta, temperature=temperature, add_tail=add_tail, reduction=reduction,
                                   ignore_index=ignore_index, student_logit_scale=student_logit_scale,
                                   student_softcap=student_softcap)
        self.beta = beta
        self.temperature = temperature
        self.add_tail = add_tail
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.student_logit_scale = student_logit_scale
        self.student_softcap = student_softcap

    def forward(self, student_logits: Tensor, teacher_logprobs: Tensor, teacher_token_ids: Tensor,
                labels: Tensor | None = None, support_mask: Tensor | None = None,
                num_items_in_batch: int | float | Tensor | None = None) -> Tensor:
        """The loss of the student's logits against the teacher's support."""
        return functional.sparse_jsd_loss(
            student_logits, teacher_logprobs, teacher_token_ids, labels, support_mask=support_mask, beta=self.beta,
            temperature=self.temperature, add_tail=self.add_tail, reduction=self.reduction,
            num_items_in_batch=num_items_in_batch, ignore_index=self.ignore_index,
            student_logit_scale=self.student_logit_scale, student_softcap=self.student_softcap,
            vocab_parallel_group=self.vocab_parallel_group)

    def extra_repr(self) -> str:
        transform = "".join(f", {name}={getattr(self, name)}" for name, default in
                            (("student_logit_scale", 1.0), ("student_softcap", None)) if getattr(self, name) != default)
        return (f"beta={self.beta}, temperature={self.temperature}, add_tail={self.add_tail}, "
                f"ignore_index={self.ignore_index}, reduction={self.reduction!r}{transform}")


class FusedLinearSparseJSDLoss(Module):
    """The served teacher's sparse divergence from the student's hidden states and ``lm_head`` weight, without
    the logits: :func:`npu_loss_ops.functional.fused_linear_sparse_jsd_loss` as a module.

    Args:
        beta (float): in ``[0, 1]``. Default: ``0.0``
        temperature (float): ``> 0``; divides the student's logits. Default: ``1.0``
        add_tail (bool): the tail bucket (``True``) or renormalization over the support. Default: ``True``
        ignore_index (int): Default: ``-100``
        reduction (str): ``'batchmean'``, ``'sum'`` or ``'mean'``. Default: ``'batchmean'``
        weight_hard_loss (float): the cross entropy's weight, ``>= 0``. Default: ``0.0``
        weight_soft_loss (float): the divergence's weight, ``>= 0``. Default: ``1.0``
        chunk_size (int, optional): rows per chunk; ``None`` sizes it by bytes. Default: ``None``
        student_logit_scale (float), student_softcap (float, optional): the student's logit transform.
        return_entropy (bool): the call returns ``(loss, entropy)``. Default: ``False``
        vocab_parallel_group (ProcessGroup, optional): the weight's rows split over this group, each rank its
            contiguous rows (docs/usage.md, "Distributed distillation"). Default: ``None``

    Raises:
        TypeError, ValueError: at construction, as the function raises them for the same arguments.

    Called as ``loss(student_input, student_weight, teacher_logprobs, teacher_token_ids, labels=None,
    student_bias=None, support_mask=None, num_items_in_batch=None)``.
    """

    def __init__(self, beta: float = 0.0, temperature: float = 1.0, add_tail: bool = True, ignore_index: int = -100,
                 reduction: str = "batchmean", weight_hard_loss: float = 0.0, weight_soft_loss: float = 1.0,
                 chunk_size: int | None = None, *, student_logit_scale: float = 1.0,
                 student_softcap: float | None = None, return_entropy: bool = False,
                 vocab_parallel_group: Any = None) -> None:
        super().__init__()
        self.vocab_parallel_group = _group("FusedLinearSparseJSDLoss", vocab_parallel_group)
        # The function's own checks, on meta tensors (labels given: a hard loss needs them).
        functional.fused_linear_sparse_jsd_loss(
            _meta(1, 1), _meta(1, 1), _meta(1, 1), torch.zeros(1, 1, dtype=torch.long, device="meta"),
            _meta(1, dtype=torch.long), beta=beta, temperature=temperature, add_tail=add_tail,
            ignore_index=ignore_index, reduction=reduction, weight_hard_loss=weight_hard_loss,
            weight_soft_loss=weight_soft_loss, chunk_size=chunk_size, student_logit_scale=student_logit_scale,
            student_softcap=student_softcap, return_entropy=return_entropy)
        self.beta = beta
        self.temperature = temperature
        self.add_tail = add_tail
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.weight_hard_loss = weight_hard_loss
        self.weight_soft_loss = weight_soft_loss
        self.chunk_size = chunk_size
        self.student_logit_scale = student_logit_scale
        self.student_softcap = student_softcap
        self.return_entropy = return_entropy

    def forward(self, student_input: Tensor, student_weight: Tensor, teacher_logprobs: Tensor,
                teacher_token_ids: Tensor, labels: Tensor | None = None, student_bias: Tensor | None = None,
                support_mask: Tensor | None = None,
                num_items_in_batch: int | float | Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """The loss of the student against the served teacher (and its entropy per row, with ``return_entropy``)."""
        result = functional.fused_linear_sparse_jsd_loss(
            student_input, student_weight, teacher_logprobs, teacher_token_ids, labels, student_bias=student_bias,
            support_mask=support_mask, beta=self.beta, temperature=self.temperature, add_tail=self.add_tail,
            reduction=self.reduction, num_items_in_batch=num_items_in_batch, ignore_index=self.ignore_index,
            student_logit_scale=self.student_logit_scale, student_softcap=self.student_softcap,
            weight_hard_loss=self.weight_hard_loss, weight_soft_loss=self.weight_soft_loss,
            chunk_size=self.chunk_size, return_entropy=self.return_entropy,
            vocab_parallel_group=self.vocab_parallel_group)
        if self.return_entropy:
            assert isinstance(result, tuple)
            return result[0], result[1]
        assert isinstance(result, Tensor)
        return result

    def extra_repr(self) -> str:
        transform = "".join(f", {name}={getattr(self, name)}" for name, default in
                            (("student_logit_scale", 1.0), ("student_softcap", None)) if getattr(self, name) != default)
        return (f"beta={self.beta}, temperature={self.temperature}, add_tail={self.add_tail}, "
                f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"weight_hard_loss={self.weight_hard_loss}, weight_soft_loss={self.weight_soft_loss}, "
                f"chunk_size={self.chunk_size}{transform}{_entropy_repr(self)}")
