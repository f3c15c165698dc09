"""Helpers of the lowering tests: build attn IR text, compile it to Triton source, load
the source under the Triton interpreter and compare it with the reference executor.

Generated kernels run on CPU tensors with `TRITON_INTERPRET=1`; the reference runs in
float64 on the same (rounded) inputs, so the difference is the kernel's own error.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch
import triton.language  # noqa: F401  (first imported here, as TRITON_INTERPRET says, not inside load_source)

from attnfuse.cache import interpreter_library, load_source
from attnfuse.compiler import compile_module
from attnfuse.ir import parse_module
from attnfuse.reference import run_reference_with_lse

MLIR_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}

# A custom mask region reading an extra tensor: keep unless kv_idx % 3 == 0, but always keep
# keys flagged in %t; never the future.
CUSTOM_MASK = """attn.mask {s} custom(%t : tensor<?xi32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %tt: tensor<?xi32>):
    %c3 = arith.constant 3 : i32
    %z = arith.constant 0 : i32
    %r = arith.remsi %ki, %c3 : i32
    %ne = arith.cmpi ne, %r, %z : i32
    %flag = attn.extract %tt[%ki] : tensor<?xi32>
    %flagged = arith.cmpi sgt, %flag, %z : i32
    %either = arith.ori %ne, %flagged : i1
    %past = arith.cmpi sle, %ki, %qi : i32
    %keep = arith.andi %either, %past : i1
    attn.yield %keep : i1
  }"""

# tanh(x / 2) + h: a score_mod using the score, a math op and the head index.
SCORE_MOD = """attn.score_mod {s} {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.constant 0.5 : f32
    %y = arith.mulf %x, %c : f32
    %t = math.tanh %y : f32
    %hf = arith.sitofp %h : i32 to f32
    %z = arith.addf %t, %hf : f32
    attn.yield %z : f32
  }"""

# Absolute tolerance of the output and of the log-sum-exp, per input dtype: fp16 rounds
# Q (after its prologue) and P to 11 bits; fp32 dots run in IEEE fp32 under the interpreter.
TOLERANCE = {torch.float16: 1e-2, torch.float32: 1e-4}


def variant(
    *,
    dtype: torch.dtype = torch.float16,
    hq: int = 2,
    hkv: int = 2,
    d: int = 32,
    dv: int | None = None,
    q_ops: Sequence[str] = (),
    k_ops: Sequence[str] = (),
    qk: str = "",
    score_ops: Sequence[str] = (),
    softmax: str = "",
    extras: Sequence[str] = (),
) -> str:
    """MLIR text of `func.func @f(%q, %k, %v, <extras>)`.

    `q_ops`/`k_ops` are pre-matmul ops applied in order, written with `{x}` for their
    input (`"attn.rope {x} half theta = 10000.0 rotary_dim = 32"`); `score_ops` are
    score ops with `{s}` for their input; the result type (` : T`) is appended to
    each. `qk` and `softmax` are extra text after their operands (`"scale = 0.5"`,
    `"sink(%sink : tensor<2xf32>)"`). In every piece `{E}` is the element type, `{S}`
    the scores type, `{QT}`/`{KT}` the q/k types."""
    dv = d if dv is None else dv
    e = MLIR_DTYPES[dtype]
    qt, kt = f"tensor<?x{hq}x?x{d}x{e}>", f"tensor<?x{hkv}x?x{d}x{e}>"
    vt, ot = f"tensor<?x{hkv}x?x{dv}x{e}>", f"tensor<?x{hq}x?x{dv}x{e}>"
    st, pt = f"!attn.scores<{hq}>", f"!attn.probs<{hq}>"

    def fill(text: str, **more: str) -> str:
        for key, value in {"E": e, "S": st, "QT": qt, "KT": kt, **more}.items():
            text = text.replace("{" + key + "}", value)
        return text

    lines = []
    q, k = "%q", "%k"
    for prefix, ops, t in (("q", q_ops, qt), ("k", k_ops, kt)):
        x = f"%{prefix}"
        for i, op in enumerate(ops):
            lines.append(f"  %{prefix}{i} = {fill(op, x=x)} : {t}")
            x = f"%{prefix}{i}"
        q, k = (x, k) if prefix == "q" else (q, x)
    lines.append(f"  %s = attn.qk {q}, {k} {fill(qk)} : {qt}, {kt} -> {st}")
    s = "%s"
    for i, op in enumerate(score_ops):
        lines.append(f"  %s{i} = {fill(op, s=s)} : {st}")
        s = f"%s{i}"
    lines.append(f"  %p = attn.softmax {s} {fill(softmax)} : {st} -> {pt}")
    lines.append(f"  %o = attn.pv %p, %v : {pt}, {vt} -> {ot}")
    sig = ", ".join([f"%q: {qt}", f"%k: {kt}", f"%v: {vt}", *(fill(x) for x in extras)])
    body = "\n".join(lines)
    return f"func.func @f({sig}) -> {ot} {{\n{body}\n  func.return %o : {ot}\n}}\n"


def qkv(
    *,
    b: int = 1,
    hq: int = 2,
    hkv: int = 2,
    nq: int = 40,
    nk: int | None = None,
    d: int = 32,
    dv: int | None = None,
    dtype: torch.dtype = torch.float16,
    seed: int = 0,
) -> list[torch.Tensor]:
    """Random q [b, hq, nq, d], k [b, hkv, nk, d], v [b, hkv, nk, dv] (nk defaults to nq)."""
    g = torch.Generator().manual_seed(seed)
    nk = nq if nk is None else nk
    dv = d if dv is None else dv
    return [torch.randn(shape, generator=g).to(dtype) for shape in ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, dv))]


_LOADED: dict[tuple[str, str, str], tuple[ModuleType, str]] = {}
"""Modules compiled and loaded by `run_kernel(..., reuse=True)`, by (IR, folder, options)."""


def _compiled(ir: str, folder: Path, reuse: bool, options: dict) -> tuple[ModuleType, str]:
    key = (ir, str(folder), repr(sorted(options.items())))
    if reuse and key in _LOADED:
        return _LOADED[key]
    compiled = compile_module(parse_module(ir), sm=0, **options)
    loaded = load_source(compiled.source, folder, interpret=True), compiled.source
    if reuse:
        _LOADED[key] = loaded
    return loaded


def run_kernel(ir: str, args: Sequence[torch.Tensor], folder: Path, *, reuse: bool = False, **options):
    """Compile `ir` for the interpreter (sm 0) with the pipeline `options`, run its
    `launch(*args)` under the interpreter and return (out, lse, compiled source).
    `reuse`: the module compiled before for the same IR, folder and options, if any (a sweep
    over shapes compiles its kernel once; the source does not depend on the shapes)."""
    module, source = _compiled(ir, folder, reuse, options)
    with interpreter_library():  # Triton's own tl.max, tl.cdiv... interpreted too
        out, lse = module.launch(*args)
    return out, lse, source


def check(
    ir: str,
    args: Sequence[torch.Tensor],
    folder: Path,
    *,
    atol: float | None = None,
    reuse: bool = False,
    **options,
) -> str:
    """Run the generated kernel and the reference on `args`; assert that the outputs
    and the log-sum-exps agree. Returns the generated source. `reuse`: see `run_kernel`."""
    out, lse, source = run_kernel(ir, args, folder, reuse=reuse, **options)
    ref, ref_lse = run_reference_with_lse(ir, *args)
    dtype = args[0].dtype
    tol = TOLERANCE[dtype] if atol is None else atol
    assert out.dtype == dtype and out.shape == ref.shape
    assert lse.shape == ref_lse.shape
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=tol)
    # Rows with every score masked have lse -inf on both sides.
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=tol)
    return source


def compile_for_sm90(kernel, args: Sequence, kwargs: dict | None = None, **options):
    """Compile the `@triton.jit` or Gluon `kernel` for sm 90 on the CPU (Triton's compiler and
    ptxas, no driver) as a launch with these arguments would: Triton's own types for them,
    constexpr parameters and constants (None, integers equal to 1, in tuples too) folded in.
    `options`: the compiler's (num_warps, num_stages)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    from triton.runtime.jit import mangle_type

    values = dict(zip(kernel.arg_names, args, strict=False)) | (kwargs or {})
    signature, constexprs = {}, {}

    def type_of(path: tuple[int, ...], value):
        if isinstance(value, tuple):
            return tuple(type_of((*path, j), x) for j, x in enumerate(value))
        kind = "constexpr" if path[0] in kernel.constexprs else mangle_type(value)
        if kind == "constexpr":
            constexprs[path] = value
        return kind

    for i, name in enumerate(kernel.arg_names):
        signature[name] = type_of((i,), values[name])
    source = (GluonASTSource if isinstance(kernel, GluonJITFunction) else ASTSource)(
        kernel, signature, constexprs=constexprs
    )
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
