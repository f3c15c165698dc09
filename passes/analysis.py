"""Structure of an attention variant in attn IR, shared by the passes.

A lowerable variant is a `func.func` with one `attn.qk` whose operands are chains
of pre-matmul ops (`attn.rope`, `attn.norm`, `attn.scale`) rooted at function
arguments, a chain of score ops up to one `attn.softmax`, and one `attn.pv` whose
v is a function argument and whose result is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    pv: attn.PVOp
    q_chain: list[Operation]
    k_chain: list[Operation]
    score_ops: list[Operation]
    q_arg: BlockArgument
    k_arg: BlockArgument
    v_arg: BlockArgument

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
    def masks(self) -> list[attn.MaskOp]:
        return [op for op in self.score_ops if isinstance(op, attn.MaskOp)]

    def ropes(self) -> list[attn.RopeOp]:
        return [op for op in self.q_chain + self.k_chain if isinstance(op, attn.RopeOp)]


def _chain(value: SSAValue, what: str) -> tuple[list[Operation], BlockArgument]:
    ops: list[Operation] = []
    while not isinstance(value, BlockArgument):
        op = value.owner
        assert isinstance(op, Operation)  # not a block argument: an op's result
        if not isinstance(op, attn.RopeOp | attn.NormOp | attn.ScaleOp):
            raise DiagnosticException(
                f"{what} of attn.qk must be a function argument transformed by attn.rope, "
                f"attn.norm or attn.scale, found '{op.name}'"
            )
        ops.append(op)
        value = op.operands[0]
    return ops[::-1], value


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
    while True:
        users = [u.operation for u in value.uses]
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
    pv_users = [u.operation for u in softmax.output.uses]
    if len(pv_users) != 1 or not isinstance(pv_users[0], attn.PVOp):
        raise DiagnosticException("the attn.softmax result must feed exactly one attn.pv")
    pv = pv_users[0]
    if not isinstance(pv.v, BlockArgument):
        raise DiagnosticException("the v operand of attn.pv must be a function argument")
    ret = f.body.block.last_op
    if not isinstance(ret, func.ReturnOp) or list(ret.operands) != [pv.output]:
        raise DiagnosticException(f"func @{f.sym_name.data} must return the attn.pv result")
    return AttentionChains(f, qk, softmax, pv, q_chain, k_chain, score_ops, q_arg, k_arg, pv.v)


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
