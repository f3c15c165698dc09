"""attn-autodiff: derive the backward program of an attention function.

`@f(q, k, v, extras...) -> out` becomes `@f_grad(q, k, v, extras..., out, lse, dout) ->
(gradients)`: the forward's ops, recomputed (kernels rebuild the probabilities from the
saved log-sum-exp `lse`), then the derivative of each block in reverse order:

- `attn.pv`: `attn.pv_grad` (dp and dv); `attn.softmax`: `attn.softmax_grad`, and
  `attn.sink_grad` for a learned sink;
- score ops: `attn.scale` by the same constant; masks and biases pass the gradient
  through (ALiBi slopes and custom biases are constants); `attn.softcap` and
  `attn.score_mod` multiply it (`attn.score_mul`) by their derivative, an `attn.score_mod`
  whose region is the symbolic derivative of the op (`region_grad`);
- `attn.qk`: `attn.qk_grad`; pre-matmul ops: `attn.scale`, `attn.rope_grad` (the inverse
  rotation), `attn.norm_grad` and `attn.norm_weight_grad` (a learned QK-norm weight).

The function's `attn.wrt` lists the arguments its results are the gradients of, in
order. A gradient the compiler cannot form (of ALiBi slopes, document ids, a custom
region's extra tensor, an explicit inv_freq) is an error naming the argument.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, TensorType, f32, i64
from xdsl.ir import Block, BlockArgument, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn
from attnfuse.passes.analysis import AttentionChains, analyse, variant_funcs
from attnfuse.passes.region_grad import derivative_region, softcap_derivative_region


def _grad_name(value: SSAValue) -> str | None:
    """The name of the gradient of `value`: `%dq` for `%q`."""
    return f"d{value.name_hint}" if value.name_hint else None


def _arg_name(f: func.FuncOp, index: int) -> str:
    hint = f.body.block.args[index].name_hint
    return hint or f"argument {index}"


def differentiable_args(chains: AttentionChains) -> dict[int, str]:
    """The arguments of the forward function that have a gradient, by index: q, k, v, a
    softmax sink and learned QK-norm weights (what each is)."""
    args: dict[int, str] = {chains.q_arg.index: "q", chains.k_arg.index: "k", chains.v_arg.index: "v"}
    sink = chains.softmax.sink
    if isinstance(sink, BlockArgument):
        args[sink.index] = "softmax sink"
    for op in chains.q_chain + chains.k_chain:
        if isinstance(op, attn.NormOp) and isinstance(op.weight, BlockArgument):
            args[op.weight.index] = "QK-norm weight"
    return args


def _why_not(chains: AttentionChains, index: int) -> str:
    """Why the argument `index` has no gradient: what reads it."""
    arg = chains.func.body.block.args[index]
    readers = sorted(
        {u.operation.name + (f" {k.data}" if (k := getattr(u.operation, "kind", None)) else "") for u in arg.uses}
    )
    if not readers:
        return "no op reads it"
    return f"it is read by {', '.join(readers)}, which AttnFuse does not differentiate with respect to it"


@dataclass
class _Builder:
    """Appends ops to the backward function's block."""

    block: Block

    def add(self, op: Operation, hint: str | None = None) -> Operation:
        self.block.add_op(op)
        if hint:
            for r in op.results:
                r.name_hint = hint
        return op


def _check_wrt(chains: AttentionChains, wrt: tuple[int, ...]) -> None:
    """Every index of `wrt` names a distinct argument that has a gradient."""
    f = chains.func
    if chains.low_precision:
        raise DiagnosticException(
            f"attn-autodiff: @{f.sym_name.data} is in the FP8 form ({chains.low_precision[0].name}), which is "
            "forward-only (inference): it has no backward"
        )
    if len(set(wrt)) != len(wrt):
        raise DiagnosticException(f"attn-autodiff wrt names an argument twice: {', '.join(map(str, wrt))}")
    differentiable = differentiable_args(chains)
    for index in wrt:
        if not 0 <= index < len(f.body.block.args):
            raise DiagnosticException(f"attn-autodiff wrt index {index} is not an argument of @{f.sym_name.data}")
        if index not in differentiable:
            raise DiagnosticException(
                f"attn-autodiff cannot form the gradient of {_arg_name(f, index)} of @{f.sym_name.data}: "
                f"{_why_not(chains, index)}"
            )


def _recompute(chains: AttentionChains, block: Block) -> dict[SSAValue, SSAValue]:
    """Clone the forward's ops but its attn.pv and return into `block`, whose first
    arguments stand for the forward's; returns the map from forward to cloned values."""
    f = chains.func
    mapping: dict[SSAValue, SSAValue] = dict(zip(f.body.block.args, block.args, strict=False))
    for op in f.body.block.ops:
        if op is chains.pv or isinstance(op, func.ReturnOp):
            continue
        clone = op.clone(value_mapper=mapping)
        block.add_op(clone)
        for old_r, new_r in zip(op.results, clone.results, strict=True):
            new_r.name_hint = old_r.name_hint
    return mapping


def build_backward(chains: AttentionChains, wrt: tuple[int, ...]) -> func.FuncOp:
    """The backward function of `chains.func` for the gradients of the arguments `wrt`."""
    f = chains.func
    _check_wrt(chains, wrt)
    out_type = chains.pv.results[0].type
    assert isinstance(out_type, TensorType)
    shape = out_type.get_shape()
    lse_type = TensorType(f32, [shape[0], shape[1], shape[2]])
    forward_args = list(f.body.block.args)
    block = Block(arg_types=[a.type for a in forward_args] + [out_type, lse_type, out_type])
    for new, old in zip(block.args, forward_args, strict=False):
        new.name_hint = old.name_hint
    out, lse, dout = block.args[-3:]
    out.name_hint, lse.name_hint, dout.name_hint = "out", "lse", "dout"
    mapping = _recompute(chains, block)
    m = mapping.__getitem__
    b = _Builder(block)

    p, v = m(chains.softmax.output), m(chains.v_arg)
    pv_grad = b.add(attn.PVGradOp(p, v, dout))
    pv_grad.results[0].name_hint, pv_grad.results[1].name_hint = "dp", "dv"
    ds = b.add(attn.SoftmaxGradOp(p, pv_grad.results[0], out, dout), _grad_name(chains.softmax.input)).results[0]
    grads: dict[int, SSAValue] = {chains.v_arg.index: pv_grad.results[1]}
    sink = chains.softmax.sink
    if isinstance(sink, BlockArgument):
        grads[sink.index] = b.add(attn.SinkGradOp(m(sink), lse, out, dout), "dsink").results[0]

    for op in reversed(chains.score_ops):
        ds = _score_grad(b, op, ds, m)

    qk = chains.qk
    qk_grad = b.add(attn.QKGradOp(ds, m(qk.q), m(qk.k), qk.effective_scale))
    dq, dk = qk_grad.results
    dq.name_hint, dk.name_hint = _grad_name(qk.q), _grad_name(qk.k)
    for chain, g, arg in ((chains.q_chain, dq, chains.q_arg), (chains.k_chain, dk, chains.k_arg)):
        for op in reversed(chain):
            g = _transform_grad(b, op, g, m, grads)
        grads[arg.index] = g

    results = [grads[i] for i in wrt]
    block.add_op(func.ReturnOp(*results))
    _erase_unused(block)
    g_func = func.FuncOp(
        f"{f.sym_name.data}_grad",
        ([a.type for a in block.args], [r.type for r in results]),
        Region(block),
    )
    g_func.attributes["attn.wrt"] = DenseArrayBase.from_list(i64, list(wrt))
    return g_func


def _score_grad(b: _Builder, op: Operation, ds: SSAValue, m) -> SSAValue:
    """The gradient of the input of score op `op`, given that of its output."""
    name = _grad_name(op.operands[0])
    if isinstance(op, attn.ScaleOp):
        return b.add(attn.ScaleOp(ds, op.value.value.data), name).results[0]
    if isinstance(op, attn.MaskOp | attn.BiasOp):
        return ds
    out, inp = op.results[0].name_hint, op.operands[0].name_hint
    deriv_name = f"d{out}_d{inp}" if out and inp else None
    if isinstance(op, attn.SoftcapOp):
        region = softcap_derivative_region(op.cap.value.data)
        deriv = b.add(attn.ScoreModOp(m(op.output), body=region), deriv_name).results[0]
    elif isinstance(op, attn.ScoreModOp):
        deriv = b.add(
            attn.ScoreModOp(m(op.input), extras=[m(e) for e in op.extras], body=derivative_region(op)), deriv_name
        ).results[0]
    else:
        raise DiagnosticException(f"attn-autodiff cannot differentiate '{op.name}'")
    return b.add(attn.ScoreMulOp(ds, deriv), name).results[0]


def _transform_grad(b: _Builder, op: Operation, g: SSAValue, m, grads: dict[int, SSAValue]) -> SSAValue:
    """The gradient of the input of pre-matmul op `op`, given that of its output; a learned
    QK-norm weight's gradient goes into `grads`."""
    name = _grad_name(op.operands[0])
    if isinstance(op, attn.ScaleOp):
        return b.add(attn.ScaleOp(g, op.value.value.data), name).results[0]
    if isinstance(op, attn.RopeOp):
        return b.add(attn.RopeGradOp(g, op, m), name).results[0]
    if isinstance(op, attn.NormOp):
        x = m(op.input)
        if isinstance(op.weight, BlockArgument):
            if op.weight.index in grads:
                raise DiagnosticException(
                    "attn-autodiff: one QK-norm weight normalises both q and k; give each its own weight tensor"
                )
            dw = b.add(attn.NormWeightGradOp(g, x, op.eps.value.data, op.weight.type), _grad_name(op.weight))
            grads[op.weight.index] = dw.results[0]
        weight = m(op.weight) if op.weight is not None else None
        return b.add(attn.NormGradOp(g, x, weight, op.eps.value.data), name).results[0]
    raise DiagnosticException(f"attn-autodiff cannot differentiate '{op.name}'")


def _erase_unused(block: Block) -> None:
    """Drop the derivative ops whose results nothing uses (the gradients not asked for).
    The recomputed forward and attn.pv_grad stay: they are the program's structure (the
    probabilities the kernels rebuild), even when only a sink's gradient is asked for."""
    ops = list(block.ops)
    first = next(i for i, op in enumerate(ops) if isinstance(op, attn.PVGradOp)) + 1
    for op in reversed(ops[first:]):
        if op.results and all(not r.uses for r in op.results):
            Rewriter.erase_op(op)


@dataclass(frozen=True)
class AttnAutodiffPass(ModulePass):
    """Replace each attention function `@f` by its backward function `@f_grad`, which
    recomputes the forward and applies the derivative of every block in reverse order. A
    function that is a backward already (it has `attn.wrt`: attn-autodiff ran) is an error."""

    name = "attn-autodiff"

    wrt: tuple[int, ...] = ()
    """Indices of the arguments to differentiate; empty: q, k, v and every other argument
    that has a gradient (a softmax sink, learned QK-norm weights)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in variant_funcs(op):
            if "attn.wrt" in f.attributes:
                raise DiagnosticException(
                    f"attn-autodiff: func @{f.sym_name.data} is already a backward function (it has attn.wrt): "
                    "attn-autodiff derives a forward function's backward, once"
                )
            chains = analyse(f)
            wrt = self.wrt or tuple(sorted(differentiable_args(chains)))
            g = build_backward(chains, wrt)
            block = f.parent_block()
            assert block is not None
            block.insert_op_before(g, f)
            f.detach()
            f.erase()
