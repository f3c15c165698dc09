"""AttnFuse: a small compiler for attention.

Write an attention variant from ten building blocks, call it on tensors, get one
fused kernel::

    import attnfuse as af

    @af.variant
    def llama(q, k, v):
        q = af.rope(q, theta=500000.0)
        k = af.rope(k, theta=500000.0)
        s = af.mask(af.qk(q, k), af.causal)
        return af.pv(af.softmax(s), v)

    out = llama(q, k, v)      # [B, Hq, Nq, D] x [B, Hkv, Nk, D] x [B, Hkv, Nk, Dv] -> [B, Hq, Nq, Dv]
    print(llama.ir())         # the traced attn IR
    kern = llama.compile(q, k, v)   # kern.source: the Triton source; kern(q, k, v) runs it

The same variant decodes against a KV cache (`llama.cache_keys`, `llama.decode`, contiguous or
paged) and runs packed sequences of different lengths (`llama.varlen`).

Named variants (Llama 3, Mistral, Gemma 2, Qwen3, BLOOM, gpt-oss, packed documents)
are in `attnfuse.variants`. The public names load on first use, so that tools which
only need the dialects (`attnfuse-opt`) do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_DSL_NAMES = (
    "alibi bias causal cos document exp exp2 hadamard linear_scaling llama3_scaling log log2 mask maximum "
    "minimum prefix_lm pv qk qk_norm quantize_fp8 rope rope_scaling rsqrt scale score_mod sigmoid sin "
    "sliding_window softcap softmax sqrt tanh where yarn_scaling"
).split()

_LAZY: dict[str, tuple[str, str]] = {
    **{n: ("attnfuse.dsl", n) for n in _DSL_NAMES},
    "abs": ("attnfuse.dsl", "abs_"),
    "AttnFuseError": ("attnfuse.errors", "AttnFuseError"),
    "Kernel": ("attnfuse.runtime", "Kernel"),
    "SlowInterpreterWarning": ("attnfuse.launch", "SlowInterpreterWarning"),
    "Variant": ("attnfuse.runtime", "Variant"),
    "backend": ("attnfuse.runtime", "backend"),
    "variant": ("attnfuse.runtime", "variant"),
    "alibi_slopes": ("attnfuse.variants", "alibi_slopes"),
    "hadamard_matrix": ("attnfuse.low_precision", "hadamard_matrix"),
}

_SUBMODULES = ("dsl", "errors", "launch", "runtime", "cache", "variants")

__all__ = [
    "AttnFuseError",
    "Kernel",
    "SlowInterpreterWarning",
    "Variant",
    "__version__",
    "abs",
    "alibi",
    "alibi_slopes",
    "backend",
    "bias",
    "cache",
    "causal",
    "cos",
    "document",
    "dsl",
    "errors",
    "exp",
    "exp2",
    "hadamard",
    "hadamard_matrix",
    "launch",
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
    "rope",
    "rope_scaling",
    "rsqrt",
    "runtime",
    "scale",
    "score_mod",
    "sigmoid",
    "sin",
    "sliding_window",
    "softcap",
    "softmax",
    "sqrt",
    "tanh",
    "variant",
    "variants",
    "where",
    "yarn_scaling",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"attnfuse.{name}")
    else:
        raise AttributeError(f"module 'attnfuse' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from attnfuse import cache, dsl, errors, launch, runtime, variants
    from attnfuse.dsl import (
        abs_ as abs,  # noqa: A001
    )
    from attnfuse.dsl import (
        alibi,
        bias,
        causal,
        cos,
        document,
        exp,
        exp2,
        hadamard,
        linear_scaling,
        llama3_scaling,
        log,
        log2,
        mask,
        maximum,
        minimum,
        prefix_lm,
        pv,
        qk,
        qk_norm,
        quantize_fp8,
        rope,
        rope_scaling,
        rsqrt,
        scale,
        score_mod,
        sigmoid,
        sin,
        sliding_window,
        softcap,
        softmax,
        sqrt,
        tanh,
        where,
        yarn_scaling,
    )
    from attnfuse.errors import AttnFuseError
    from attnfuse.launch import SlowInterpreterWarning
    from attnfuse.low_precision import hadamard_matrix
    from attnfuse.runtime import Kernel, Variant, backend, variant
    from attnfuse.variants import alibi_slopes
