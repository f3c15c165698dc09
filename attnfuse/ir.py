"""Reading attn IR: the xDSL context AttnFuse parses with, verification, and finding
the variant's function.

Shared by the reference executor, the compiler driver, the runtime and `attnfuse-opt`,
so that all of them accept the same IR text and reject malformed IR the same way
(the library with an `AttnFuseError`, a `ValueError`; the tool with a diagnostic).

Verification is xDSL's (each op's own rules) plus SSA dominance, which xDSL 0.74 does
not check: its parser accepts a use of a value before its definition (a forward
reference, legal in MLIR's syntax), so a module such as

    %o = attn.pv %p, %v : ...
    %p = attn.softmax %s : ...

would otherwise verify and be lowered into a kernel that reads `%p` before computing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin, FileLineColLoc, ModuleOp
from xdsl.dialects.func import Func, FuncOp
from xdsl.dialects.math import Math
from xdsl.ir import Block, BlockArgument, Operation, OpResult, Region, SSAValue
from xdsl.irdl.dominance import DominanceInfo
from xdsl.parser import Parser
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException
from xdsl.utils.lexer import Span

from attnfuse.dialects.attn import Attn
from attnfuse.errors import AttnFuseError


def make_context() -> Context:
    """A context with every dialect attn IR may contain: builtin, func, arith, math, attn."""
    ctx = Context()
    for dialect in (Builtin, Func, Arith, Math, Attn):
        ctx.load_dialect(dialect)
    return ctx


# --------------------------------------------------------------------------- source locations


@dataclass
class SourceMap:
    """Where in the source text each parsed operation starts, for diagnostics.

    xDSL's parser attaches no location to an operation unless the text spells one
    (`loc("file":3:5)`); `LocatingParser` records the position of every operation it
    reads instead. `line_offset` is added to every line: the number of lines before the
    text, when it is one `// -----` chunk of a larger file."""

    spans: dict[Operation, Span] = field(default_factory=dict[Operation, Span])
    line_offset: int = 0

    def line(self, op: Operation) -> int | None:
        """The 1-based line where `op` starts (its explicit `loc(...)` if it has one),
        or None for an operation the text did not contain, such as one a pass created."""
        if isinstance(op.location, FileLineColLoc):
            return op.location.line.data
        if (span := self.spans.get(op)) is None:
            return None
        return span.get_location().line + self.line_offset

    def locate(self, op: Operation) -> str | None:
        """`file:line:column` of `op`, or None where unknown (see `line`)."""
        if isinstance(op.location, FileLineColLoc):
            loc = op.location
            return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
        if (span := self.spans.get(op)) is None:
            return None
        where = span.get_location()
        return f"{where.file}:{where.line + self.line_offset}:{where.col}"


def locate(op: Operation, source: SourceMap | None) -> str | None:
    """`file:line:column` of `op` from its explicit location or from `source`, if known."""
    return (source or SourceMap()).locate(op)


class LocatingParser(Parser):
    """xDSL's MLIR parser, recording in `source` where each operation starts."""

    source: SourceMap

    def __init__(self, ctx: Context, input: str | bytes, name: str = "<unknown>", line_offset: int = 0):
        super().__init__(ctx, input, name)
        self.source = SourceMap(line_offset=line_offset)

    def parse_operation(self) -> Operation:
        start = self.pos
        op = super().parse_operation()
        self.source.spans[op] = Span(start, start, self.lexer.input)
        return op


# --------------------------------------------------------------------------- verification


@dataclass
class VerifierError:
    """The first rule a module breaks: `op` is the operation whose verification failed
    (None for a check xDSL makes on a block rather than on an operation)."""

    op: Operation | None
    error: DiagnosticException


def first_verifier_error(root: Operation, source: SourceMap | None = None) -> VerifierError | None:
    """The first verification failure of `root` and everything nested in it, or None.

    The checks are xDSL's own (`Operation.verify`: structure, traits, each op's
    `verify_`), innermost operations first as xDSL orders them, then SSA dominance
    (`check_dominance`). Unlike `root.verify()`, the answer names the failing
    operation, so a caller can point at its line."""
    if (found := _first_op_error(root)) is not None:
        return found
    try:
        check_dominance(root, source)
    except _DominanceError as e:
        return VerifierError(e.op, e)
    return None


def verify_module(root: Operation, source: SourceMap | None = None) -> None:
    """Verify `root` as `first_verifier_error` does; raise the first failure's
    `VerifyException` (carrying xDSL's note: the module with the op underlined)."""
    if (found := first_verifier_error(root, source)) is not None:
        raise found.error


def _first_op_error(op: Operation) -> VerifierError | None:
    for region in op.regions:
        for block in region.blocks:
            for child in block.ops:
                if (found := _first_op_error(child)) is not None:
                    return found
            if block.first_op is None:
                try:
                    block.verify()  # an empty block where a terminator is required
                except VerifyException as e:
                    return VerifierError(None, e)
    try:
        op.verify(verify_nested_ops=False)
    except VerifyException as e:
        return VerifierError(op, e)
    return None


class _DominanceError(VerifyException):
    """A use that its definition does not dominate; `op` is the user."""

    def __init__(self, message: str, op: Operation):
        super().__init__(message)
        self.op = op


def check_dominance(root: Operation, source: SourceMap | None = None) -> None:
    """Raise a `VerifyException` at the first operand of an op nested in `root` whose
    definition does not properly dominate the op, as MLIR's verifier does:

    - a result of op D is usable after D in D's block, inside later ops' regions, and in
      blocks that D's block dominates (within D's region);
    - a block argument is usable in its block, the blocks it dominates, and any region
      nested in them;
    - an op never uses its own results, even from inside its regions.

    The body of a `builtin.module` is a graph region (MLIR's RegionKind::Graph), where
    order does not matter. The message names the using op, the value and, where known,
    both locations."""
    checker = _Dominance()
    for op in root.walk():
        for index, operand in enumerate(op.operands):
            if (problem := checker.problem(operand, op)) is None:
                continue
            name = f"%{operand.name_hint}" if operand.name_hint else "a value"
            where = locate(op, source)
            message = f"{op.name}{f' at {where}' if where else ''} uses {name} (operand #{index}){problem}"
            if isinstance(operand, OpResult) and not operand.op.is_ancestor(op):
                defined = locate(operand.op, source)
                message += f" (defined by {operand.op.name}{f' at {defined}' if defined else ''})"
            op.emit_error(message, _DominanceError(message, op))


class _Dominance:
    """Answers "does this value dominate this use?", caching block order and the
    dominator sets of multi-block regions."""

    def __init__(self) -> None:
        self._order: dict[Block, dict[Operation, int]] = {}
        self._info: dict[Region, DominanceInfo] = {}

    def problem(self, value: SSAValue, user: Operation) -> str | None:
        """None if `value` properly dominates `user`, else what is wrong, as the end of a
        sentence "<user> uses <value>..."."""
        if isinstance(value, OpResult):
            definer = value.op
            if definer.is_ancestor(user):
                return ", which is its own result"
            block = definer.parent_block()
            if block is None:
                return ", whose defining op is not in the IR"
            if (ancestor := block.find_ancestor_op_in_block(user)) is not None:
                if _is_graph_region(block.parent) or self._index(definer) < self._index(ancestor):
                    return None
                return " before its definition"
        elif isinstance(value, BlockArgument):
            block = value.block
        else:
            return ", which is neither an op result nor a block argument"
        region = block.parent
        if region is None:
            return ", whose block is not in a region"
        ancestor = _ancestor_in_region(user, region)
        if ancestor is None:
            return " outside the region that defines it"
        use_block = ancestor.parent_block()
        if use_block is block or (use_block is not None and self._dominates(region, block, use_block)):
            return None
        return " in a block that its definition does not dominate"

    def _index(self, op: Operation) -> int:
        block = op.parent_block()
        assert block is not None
        if (order := self._order.get(block)) is None:
            order = self._order[block] = {o: i for i, o in enumerate(block.ops)}
        return order[op]

    def _dominates(self, region: Region, a: Block, b: Block) -> bool:
        if (info := self._info.get(region)) is None:
            info = self._info[region] = DominanceInfo(region)
        return info.dominates(a, b)


def _is_graph_region(region: Region | None) -> bool:
    return region is not None and isinstance(region.parent, ModuleOp)


def _ancestor_in_region(op: Operation, region: Region) -> Operation | None:
    """`op` itself or its ancestor whose block lies directly in `region`, or None."""
    current: Operation | None = op
    while current is not None:
        block = current.parent_block()
        if block is not None and block.parent is region:
            return current
        current = current.parent_op()
    return None


# --------------------------------------------------------------------------- reading attn IR


def parse_module(text: str, name: str = "<attn ir>") -> ModuleOp:
    """Parse and verify MLIR text (a bare `func.func` is wrapped in a `builtin.module`).

    Verification includes dominance (`verify_module`). Malformed or invalid IR raises
    `AttnFuseError` (a `ValueError`) carrying xDSL's diagnostic; for a broken rule it
    names the operation and, where it has one, its `name:line:column`."""
    try:
        parser = LocatingParser(make_context(), text, name)
        module = parser.parse_module()
        verify_module(module, parser.source)
    except (ParseError, DiagnosticException) as e:
        raise AttnFuseError(f"invalid attn IR ({name}):\n{e}") from e
    except RecursionError as e:
        raise AttnFuseError(f"invalid attn IR ({name}): nested too deeply to read") from e
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
