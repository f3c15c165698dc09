"""Reading attn IR: the xDSL context AttnFuse parses with, and finding the variant's function.

Shared by the reference executor, the compiler driver and the runtime, so that all of
them accept the same IR text and reject malformed IR with the same `AttnFuseError`
(a `ValueError`).
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func, FuncOp
from xdsl.dialects.math import Math
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException

from attnfuse.dialects.attn import Attn
from attnfuse.errors import AttnFuseError


def make_context() -> Context:
    """A context with every dialect attn IR may contain: builtin, func, arith, math, attn."""
    ctx = Context()
    for dialect in (Builtin, Func, Arith, Math, Attn):
        ctx.load_dialect(dialect)
    return ctx


def parse_module(text: str, name: str = "<attn ir>") -> ModuleOp:
    """Parse and verify MLIR text (a bare `func.func` is wrapped in a `builtin.module`).

    Malformed or invalid IR raises `AttnFuseError` (a `ValueError`) carrying xDSL's
    diagnostic."""
    try:
        module = Parser(make_context(), text, name).parse_module()
        module.verify()
    except (ParseError, VerifyException) as e:
        raise AttnFuseError(f"invalid attn IR ({name}):\n{e}") from e
    return module


def get_func(ir: ModuleOp | FuncOp | str) -> FuncOp:
    """The one `func.func` of a variant: `ir` is the function itself, a `builtin.module`
    holding exactly one function, or MLIR text of such a module."""
    if isinstance(ir, str):
        ir = parse_module(ir)
    if isinstance(ir, FuncOp):
        func = ir
    elif isinstance(ir, ModuleOp):
        funcs = [op for op in ir.ops if isinstance(op, FuncOp)]
        if len(funcs) != 1:
            raise AttnFuseError(f"expected a builtin.module holding exactly one func.func, found {len(funcs)}")
        func = funcs[0]
    else:
        raise AttnFuseError(f"expected attn IR as a builtin.module, a func.func or MLIR text, got {type(ir).__name__}")
    if not func.body.blocks:
        raise AttnFuseError(f"func.func @{func.sym_name.data} has no body")
    return func
