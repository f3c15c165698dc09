"""The Python front end: the ten building blocks, traced into `attn` IR.

A variant is a Python function of `(q, k, v, *extras)`. The runtime calls it once per
argument signature with symbolic proxies instead of tensors (`trace`); each building
block (`rope`, `qk_norm`, `scale`, `qk`, `mask`, `bias`, `softcap`, `score_mod`,
`softmax`, `pv`, and the FP8 form's `hadamard` and `quantize_fp8`) appends the matching
`attn` op to a `func.func`, and the function's return value, the result of `pv`, becomes
the function's result.

Custom predicates `fn(b, h, q_idx, kv_idx)`, biases (same arguments) and score
modifiers `fn(score, b, h, q_idx, kv_idx)` are Python callables traced into the
region of a `custom` `attn.mask`/`attn.bias`/`attn.score_mod`: their arguments are
`Scalar` proxies, and arithmetic on them appends `arith`/`math` ops to the region.
`q_idx` and `kv_idx` are *positions*: kv 0..Nk-1, queries Nk-Nq..Nk-1.

Scalar semantics inside regions:

- Python ints are i32, floats f32, booleans i1. Mixing an int and a float converts
  the int (`arith.sitofp`); booleans take part in arithmetic as 0/1 (`arith.extui`).
- `/` always gives a float, as in Python. `//` and `%` on ints round toward minus
  infinity, as in Python: `a // b` is `arith.floordivsi` and `a % b` is
  `a - (a // b) * b`, so `-7 // 2 == -4` and `-7 % 2 == 1`. They need int operands.
- `&`, `|`, `^`, `~` are logical on booleans and bitwise on ints; comparisons give
  booleans. Python's `and`, `or`, `not`, `if` and chained comparisons need a concrete
  truth value and raise `AttnFuseError`: use `&`, `|`, `~` and `where`.
- Indexing an extra tensor of the variant (`ids[b, kv_idx]`) reads one element
  (`attn.extract`); the tensor becomes an operand of the op and an argument of its
  region. Float elements are widened to f32 and int64 elements narrowed to i32.

The package's modules, each importing only those above it:

- `scalars`: the base of symbolic values, the regions of custom functions, `Scalar`
  and its arithmetic, and the math functions (`where`, `exp`, ..., `sigmoid`);
- `tracing`: what a trace takes and gives (`TensorArg`, `ExtraSpec`, `Trace`), the
  tracer, `trace`, and the tensor, score and probability proxies;
- `predicates`: mask predicates (`causal`, `sliding_window`, `prefix_lm`, `document`,
  custom) and biases (`alibi`, custom);
- `blocks`: the ten building blocks and RoPE's scaling schemes.

Every public name is re-exported here, so `attnfuse.dsl.X` and `af.X` work.
"""

from attnfuse.dsl.blocks import (
    bias,
    hadamard,
    linear_scaling,
    llama3_scaling,
    mask,
    pv,
    qk,
    qk_norm,
    quantize_fp8,
    rope,
    rope_scaling,
    scale,
    score_mod,
    softcap,
    softmax,
    yarn_scaling,
)
from attnfuse.dsl.predicates import (
    BiasFn,
    CustomMask,
    MaskPredicate,
    NamedMask,
    alibi,
    causal,
    document,
    prefix_lm,
    sliding_window,
)
from attnfuse.dsl.scalars import (
    Scalar,
    abs_,
    cos,
    exp,
    exp2,
    log,
    log2,
    maximum,
    minimum,
    rsqrt,
    sigmoid,
    sin,
    sqrt,
    tanh,
    where,
)
from attnfuse.dsl.tracing import (
    ELEMENT_TYPES,
    QKV_DTYPES,
    ExtraProxy,
    ExtraSpec,
    ProbsProxy,
    ScoresProxy,
    TensorArg,
    TensorProxy,
    Trace,
    trace,
)

__all__ = [
    "ELEMENT_TYPES",
    "QKV_DTYPES",
    "BiasFn",
    "CustomMask",
    "ExtraProxy",
    "ExtraSpec",
    "MaskPredicate",
    "NamedMask",
    "ProbsProxy",
    "Scalar",
    "ScoresProxy",
    "TensorArg",
    "TensorProxy",
    "Trace",
    "abs_",
    "alibi",
    "bias",
    "causal",
    "cos",
    "document",
    "exp",
    "exp2",
    "linear_scaling",
    "llama3_scaling",
    "log",
    "log2",
    "mask",
    "maximum",
    "minimum",
    "prefix_lm",
    "pv",
    "qk",
    "qk_norm",
    "quantize_fp8",
    "hadamard",
    "rope",
    "rope_scaling",
    "rsqrt",
    "scale",
    "score_mod",
    "sigmoid",
    "sin",
    "sliding_window",
    "softcap",
    "softmax",
    "sqrt",
    "tanh",
    "trace",
    "where",
    "yarn_scaling",
]
