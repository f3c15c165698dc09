"""Structure of an attention variant in attn IR, shared by the passes.

A lowerable variant is a `func.func` with one `attn.qk` whose operands are chains
of pre-matmul ops (`attn.rope`, `attn.norm`, `attn.scale`, and the FP8 form's
`attn.hadamard` and `attn.quantize`) rooted at function arguments, a chain of score
ops up to one `attn.softmax`, and one `attn.pv` whose v is a function argument (or
its `attn.quantize`) and whose result is returned.

A backward function (attn-autodiff's, marked `attn.wrt`) has the same chains, and its
probabilities feed `attn.pv_grad` and `attn.softmax_grad` instead of `attn.pv`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.utils.exceptions import DiagnosticException

from attnfuse.dialects import attn


@dataclass
class AttentionChains:
    """The pieces of one variant, in application order."""

    func: func.FuncOp
    qk: attn.QKOp
    softmax: attn.SoftmaxOp
    pv: attn.PVOp | attn.PVGradOp
    """attn.pv, or in a backward function attn.pv_grad."""
    q_chain: list[Operation]
    k_chain: list[Operation]
    score_ops: list[Operation]
    q_arg: BlockArgument
    k_arg: BlockArgument
    v_arg: BlockArgument
    v_chain: list[Operation] = field(default_factory=list)
    """v's transforms: empty, or its attn.quantize (the FP8 form)."""

    @property
    def q_type(self) -> TensorType:
        return self.q_arg.type  # type: ignore[return-value]

    @property
    def k_type(self) -> TensorType:
        return self.k_arg.type  # type: ignore[return-value]

    @property
    def v_type(self) -> TensorType:
        return self.v_arg.type  # type: ignore[return-value]

    @property
    def is_backward(self) -> bool:
        return isinstance(self.pv, attn.PVGradOp)

    @property
    def masks(self) -> list[attn.MaskOp]:
        return [op for op in self.score_ops if isinstance(op, attn.MaskOp)]

    def ropes(self) -> list[attn.RopeOp]:
        return [op for op in self.q_chain + self.k_chain if isinstance(op, attn.RopeOp)]

    @property
    def low_precision(self) -> list[Operation]:
        """The FP8 form's ops (attn.hadamard, attn.quantize) on q, k and v."""
        return [op for op in self.q_chain + self.k_chain + self.v_chain if isinstance(op, attn.LOW_PRECISION_OPS)]


def _chain(value: SSAValue, what: str) -> tuple[list[Operation], BlockArgument]:
    ops: list[Operation] = []
    while not isinstance(value, BlockArgument):
        op = value.owner
        assert isinstance(op, Operation)  # not a block argument: an op's result
        if not isinstance(op, attn.PRE_MATMUL_OPS):
            raise DiagnosticException(
                f"{what} of attn.qk must be a function argument transformed by attn.rope, "
                f"attn.norm, attn.scale, attn.hadamard or attn.quantize, found '{op.name}'"
            )
        ops.append(op)
        value = op.operands[0]
    return ops[::-1], value


NO_ATTENTION = (
    "no attention to compile: no func.func in the module contains an attn.qk (a variant is "
    "attn.qk, its score ops, attn.softmax and attn.pv, whose result the function returns; "
    "see attnfuse/examples/*.mlir)"
)
"""The message for a module whose functions hold no attention at all."""


def analyse(f: func.FuncOp) -> AttentionChains:
    """Split `f` into its chains; a DiagnosticException names what cannot be lowered."""
    qks = [op for op in f.walk() if isinstance(op, attn.QKOp)]
    if len(qks) != 1:
        raise DiagnosticException(
            f"func @{f.sym_name.data} must contain exactly one attn.qk to be lowered, found {len(qks)}"
        )
    qk = qks[0]
    q_chain, q_arg = _chain(qk.q, "q")
    k_chain, k_arg = _chain(qk.k, "k")
    score_ops: list[Operation] = []
    value: SSAValue = qk.scores
    backward = "attn.wrt" in f.attributes
    while True:
        users = [u.operation for u in value.uses]
        if backward:
            users = [u for u in users if not _is_derivative(u)]
        if len(users) != 1:
            raise DiagnosticException("the scores of attn.qk must flow through one chain of score ops")
        user = users[0]
        if isinstance(user, attn.SoftmaxOp):
            softmax = user
            break
        if not isinstance(user, attn.SCORE_OPS):
            raise DiagnosticException(f"'{user.name}' cannot consume attention scores")
        score_ops.append(user)
        value = user.results[0]
    pv = _pv_of(f, softmax)
    v_chain: list[Operation] = []
    v = pv.v
    if isinstance(v.owner, attn.QuantizeOp):
        v_chain, v = [cast(Operation, v.owner)], v.owner.input
    if not isinstance(v, BlockArgument):
        raise DiagnosticException(f"the v operand of {pv.name} must be a function argument (or its attn.quantize)")
    return AttentionChains(f, qk, softmax, pv, q_chain, k_chain, score_ops, q_arg, k_arg, v, v_chain)


def _is_derivative(op: Operation) -> bool:
    """In a backward function: an attn.score_mod computing a score op's derivative (its
    result multiplies a gradient), not a forward op."""
    return isinstance(op, attn.ScoreModOp) and all(isinstance(u.operation, attn.ScoreMulOp) for u in op.output.uses)


def _pv_of(f: func.FuncOp, softmax: attn.SoftmaxOp) -> attn.PVOp | attn.PVGradOp:
    """The attn.pv the probabilities feed (whose result `f` returns), or in a backward
    function the attn.pv_grad."""
    users = [u.operation for u in softmax.output.uses]
    if "attn.wrt" in f.attributes:
        grads = [u for u in users if isinstance(u, attn.PVGradOp)]
        if len(grads) != 1 or not all(isinstance(u, attn.PVGradOp | attn.SoftmaxGradOp) for u in users):
            raise DiagnosticException(
                "in a backward function the attn.softmax result must feed one attn.pv_grad and attn.softmax_grad"
            )
        return grads[0]
    if len(users) != 1 or not isinstance(users[0], attn.PVOp):
        raise DiagnosticException("the attn.softmax result must feed exactly one attn.pv")
    pv = users[0]
    ret = f.body.block.last_op
    if not isinstance(ret, func.ReturnOp) or list(ret.operands) != [pv.output]:
        raise DiagnosticException(f"func @{f.sym_name.data} must return the attn.pv result")
    return pv


def variant_funcs(module: ModuleOp) -> list[func.FuncOp]:
    """The functions of `module` that hold an attention (an attn.qk)."""
    return [op for op in module.ops if isinstance(op, func.FuncOp) and any(isinstance(o, attn.QKOp) for o in op.walk())]


def check_sm(sm: int, pass_name: str) -> int:
    """`sm` if it names a target: 0 (the CPU interpreter) or a CUDA compute capability
    written as one number (70 to 129: 90 is Hopper, 100 Blackwell)."""
    if sm != 0 and not 70 <= sm <= 129:
        raise ValueError(
            f"{pass_name} sm must be 0 (the CPU interpreter) or a CUDA compute capability from 70 to 129 "
            f"(e.g. 80, 90), got {sm}"
        )
    return sm


def target_option(module: ModuleOp, key: str, given: int | None, default: int) -> int:
    """An option given to a pass, else the module's `attn.target` entry, else `default`."""
    if given is not None:
        return given
    target = module.attributes.get("attn.target")
    if target is not None:
        value = target.data.get(key)  # type: ignore[attr-defined]
        if value is not None:
            return value.value.data
    return default
