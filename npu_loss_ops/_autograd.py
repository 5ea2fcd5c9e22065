"""Autograd for the npu_loss ops, registered once at the Autograd key (CPU, NPU and every other device).

Forwards: gradients w.r.t. self and target. Autograd hands the backward ops broadcast-expanded self and
target (views, no copies) and sums each gradient back to its input's shape: smooth L1's "mean" divides by
self.numel(), and the target gradient is the same op with self and target swapped (the slope is odd in
d), both of which need the broadcast shape.

Backward ops: their own formulas (ATen's derivatives.yaml), so double backward works. Only inputs are
saved, never intermediates.
"""
import torch

_ops = torch.ops.npu_loss
MEAN = 1


def _scale(reduction: int, count: int) -> float:
    return 1.0 / count if reduction == MEAN else 1.0


def _grad_to(grad, like: torch.Tensor):
    """A gradient reduced to `like`'s shape and dtype."""
    if grad is None:
        return None
    return grad.sum_to_size(like.shape).to(like.dtype)


def _broadcast_pair(self: torch.Tensor, target: torch.Tensor):
    shape = torch.broadcast_shapes(self.shape, target.shape)
    return self.expand(shape), target.expand(shape)


def _save_inputs(ctx, *tensors):
    if any(ctx.needs_input_grad):
        ctx.save_for_backward(*tensors)


# ---- smooth_l1_loss ----

def _smooth_l1_loss_setup(ctx, inputs, output):
    self, target, reduction, beta = inputs
    ctx.reduction, ctx.beta = reduction, beta
    _save_inputs(ctx, self, target)


def _smooth_l1_loss_backward(ctx, grad):
    self, target = ctx.saved_tensors
    x, t = _broadcast_pair(self, target)
    grad_self = grad_target = None
    if ctx.needs_input_grad[0]:
        grad_self = _ops.smooth_l1_loss_backward(grad, x, t, ctx.reduction, ctx.beta)
    if ctx.needs_input_grad[1]:
        grad_target = _ops.smooth_l1_loss_backward(grad, t, x, ctx.reduction, ctx.beta)
    return _grad_to(grad_self, self), _grad_to(grad_target, target), None, None


# ---- l1_loss ----

def _l1_loss_setup(ctx, inputs, output):
    self, target, reduction = inputs
    ctx.reduction = reduction
    _save_inputs(ctx, self, target)


def _l1_loss_backward(ctx, grad):
    self, target = ctx.saved_tensors
    x, t = _broadcast_pair(self, target)
    grad_self = grad_target = None
    if ctx.needs_input_grad[0]:
        grad_self = _ops.l1_loss_backward(grad, x, t, ctx.reduction)
    if ctx.needs_input_grad[1]:
        grad_target = _ops.l1_loss_backward(grad, t, x, ctx.reduction)
    return _grad_to(grad_self, self), _grad_to(grad_target, target), None


# ---- kl_div ----

def _kl_div_setup(ctx, inputs, keyword_only_inputs, output):
    self, target, reduction = inputs
    ctx.reduction = reduction
    ctx.log_target = keyword_only_inputs["log_target"]
    _save_inputs(ctx, self, target)


def _kl_div_backward(ctx, grad):
    self, target = ctx.saved_tensors
    grad_self = grad_target = None
    if ctx.needs_input_grad[0]:
        shape = torch.broadcast_shapes(self.shape, target.shape)
        p = target.exp() if ctx.log_target else target
        g = grad * _scale(ctx.reduction, shape.numel())
        grad_self = (-(g * p)).expand(shape)
    if ctx.needs_input_grad[1]:
        grad_target = _ops.kl_div_target_backward(grad, self, target, ctx.reduction, ctx.log_target)
    return _grad_to(grad_self, self), _grad_to(grad_target, target), None


# ---- the backward ops (double backward) ----

def _backward_op_setup(ctx, inputs, output):
    grad_output, self, target, reduction, *extra = inputs
    # extra: beta for smooth L1, log_target for KL, nothing for L1.
    ctx.reduction, ctx.extra = reduction, (extra[0] if extra else None)
    _save_inputs(ctx, grad_output, self, target)


def _smooth_l1_loss_backward_backward(ctx, gg):
    grad_output, self, target = ctx.saved_tensors
    beta = ctx.extra
    d_grad_output = d_self = d_target = None
    if ctx.needs_input_grad[0]:
        d_grad_output = _ops.smooth_l1_loss_backward(gg, self, target, ctx.reduction, beta)
    if (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]) and beta > 0:
        # The slope d / beta has derivative 1 / beta inside |d| < beta, 0 elsewhere.
        d = self - target
        inner = (d.abs() < beta) * (grad_output * gg) * (_scale(ctx.reduction, self.numel()) / beta)
        d_self, d_target = inner, -inner
    return (
        _grad_to(d_grad_output, grad_output), _grad_to(d_self, self), _grad_to(d_target, target), None, None
    )


def _l1_loss_backward_backward(ctx, gg):
    grad_output, self, target = ctx.saved_tensors
    d_grad_output = None
    if ctx.needs_input_grad[0]:
        d_grad_output = _ops.l1_loss_backward(gg, self, target, ctx.reduction)
    # sign(d) is piecewise constant: no gradient w.r.t. self or target.
    return _grad_to(d_grad_output, grad_output), None, None, None


def _kl_div_target_backward_backward(ctx, gg):
    grad_output, self, target = ctx.saved_tensors
    shape = torch.broadcast_shapes(self.shape, target.shape)
    s = _scale(ctx.reduction, shape.numel())
    t = target
    if ctx.extra:  # log_target
        e = t.exp()
        d_g = gg * s * e * (t + 1 - self)
        d_x = -gg * grad_output * s * e
        d_t = gg * grad_output * s * e * (t + 2 - self)
    else:
        # A zero probability gets no gradient, and neither do its derivatives.
        zero = t == 0
        safe_t = torch.where(zero, torch.ones_like(t), t)
        d_g = torch.where(zero, 0, gg * s * (safe_t.log() + 1 - self))
        d_x = torch.where(zero, 0, -gg * grad_output * s)
        d_t = torch.where(zero, 0, gg * grad_output * s / safe_t)
    needs = ctx.needs_input_grad
    return (
        _grad_to(d_g.expand(shape), grad_output) if needs[0] else None,
        _grad_to(d_x.expand(shape), self) if needs[1] else None,
        _grad_to(d_t.expand(shape), target) if needs[2] else None,
        None,
        None,
    )


def _register():
    reg = torch.library.register_autograd
    reg("npu_loss::smooth_l1_loss", _smooth_l1_loss_backward, setup_context=_smooth_l1_loss_setup)
    reg("npu_loss::l1_loss", _l1_loss_backward, setup_context=_l1_loss_setup)
    reg("npu_loss::kl_div", _kl_div_backward, setup_context=_kl_div_setup)
    reg(
        "npu_loss::smooth_l1_loss_backward",
        _smooth_l1_loss_backward_backward,
        setup_context=_backward_op_setup,
    )
    reg("npu_loss::l1_loss_backward", _l1_loss_backward_backward, setup_context=_backward_op_setup)
    reg(
        "npu_loss::kl_div_target_backward",
        _kl_div_target_backward_backward,
        setup_context=_backward_op_setup,
    )


_register()
