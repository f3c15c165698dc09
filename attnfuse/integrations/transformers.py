"""Hugging Face transformers (5.x) models with AttnFuse attention: `apply(model) -> model`.

::

    from transformers import AutoModelForCausalLM
    from attnfuse.integrations.transformers import apply

    model = apply(AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B"))

`apply` patches the model in place: every attention layer keeps its projections (q_proj, k_proj,
v_proj, o_proj and, for Qwen3, q_norm/k_norm) and runs its attention as one AttnFuse variant with
RoPE, and Qwen3's QK-norm, inside the kernel, on the un-rotated q and k:

- every constant comes from the model's config: rope theta and scaling (`config.rope_parameters`:
  default, linear, llama3, yarn), head dim, sliding windows (Mistral's `sliding_window`, the
  `layer_types` of Qwen2/Qwen3, Gemma 2 and gpt-oss), Gemma 2's `attn_logit_softcapping` and
  `query_pre_attn_scalar`, Qwen3's `rms_norm_eps`; gpt-oss's learned sinks and Qwen3's norm weights are
  the layer's own parameters, passed to the kernel, so they get gradients;
- RoPE rotates at Hugging Face's `position_ids` (left-padded, packed or offset batches);
- a padding `attention_mask` reaches the attention as the 2-D key mask (through the attention
  implementation "attnfuse" registered with transformers' `AttentionInterface` and
  `AttentionMaskInterface`) and becomes a key predicate of the variant; without padding the
  variant is plain causal (or windowed), which the compiler splits into skipped, full and partial
  blocks; packed sequences are found where transformers' own masks find them (positions
  restarting or jumping, no mask and no cache: an all-ones mask is not packing), decided once per
  forward by the mask interface from transformers' mask function, and run through
  `Variant.varlen` (each document alone; under torch.compile, whose trace cannot read the
  documents' bounds, as a document mask);
- with a KV cache (`generate()`), K is rotated (and normalised) once, when written: the cache holds
  rotated keys and a call that extends a cache runs the variant whose q is rotated in the kernel
  at its positions and whose k is taken as is; for up to 16 new tokens needing no gradient, through
  that variant's decode kernels (`Variant.decode`: split-KV, GQA packed). A first call on an empty
  cache runs the fully fused variant and also writes its rotated keys. The dynamic cache (the
  default) and the static one (`cache_implementation="static"`, which generate() compiles and
  captures in CUDA graphs) work: with a static cache a decoding step reads the cache's length on
  the device, so it compiles (`fullgraph=True`) to one `attnfuse::decode` node per layer; a static
  cache's sliding-window layers (rolling buffers) are refused.

Variants are built once per layer configuration (theta, scaling, norm, softcap, window, sinks,
cached or not, mask kind) and shared by the layers that have it. Training works on every backend:
the variants are differentiable. `apply` gives the model its own copy of its config (transformers
shares one between the models built from it), and a patched model pickles (`PatchedAttention`).
An architecture or option it does not handle (another model type, an unknown rope type or one
lacking a parameter, a partial rotary factor, cross-attention, bidirectional attention, attention
dropout while training, a static cache with sliding-window layers, a 4-D attention mask,
`output_attentions`: AttnFuse never materialises the attention weights) raises `AttnFuseError`
naming it; `apply` never returns a model it left unpatched.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

import torch

import attnfuse as af
from attnfuse import inference
from attnfuse.errors import AttnFuseError
from attnfuse.integrations.hf_config import (
    FAMILIES,
    Family,
    LayerSpec,
    check_config,
    family_of,
    layer_spec,
    rope_from_config,
)
from attnfuse.integrations.hf_rope import rotate

try:
    import transformers
    from transformers.cache_utils import DynamicLayer, StaticLayer
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface
except ImportError as e:  # pragma: no cover - the optional extra is missing
    raise ImportError("attnfuse.integrations.transformers needs transformers 5.x: pip install 'attnfuse[hf]'") from e

__all__ = [
    "ATTN_IMPLEMENTATION",
    "FAMILIES",
    "LayerSpec",
    "PatchedAttention",
    "apply",
    "layer_spec",
    "rope_from_config",
    "rotate",
    "variant",
]

ATTN_IMPLEMENTATION = "attnfuse"
"""The attention implementation name `apply` registers with transformers and sets on the model."""


_MASKS = ("causal", "padded", "packed")
VARLEN = "varlen"
"""The mask kind of packed sequences run through `Variant.varlen` (no document mask: each sequence
alone, RoPE at positions within it)."""


# --------------------------------------------------------------------------- the variants


def _argument_names(spec: LayerSpec, cached: bool, mask: str) -> list[str]:
    names = ["q", "k", "v"]
    if mask != VARLEN:  # packed sequences through Variant.varlen: positions within each
        names.append("q_positions")
        if not cached:
            names.append("k_positions")
    if spec.norm_eps is not None:
        names += ["q_norm_weight"] if cached else ["q_norm_weight", "k_norm_weight"]
    if spec.sinks:
        names.append("sinks")
    if mask == "padded":
        names.append("key_ok")
    elif mask == "packed":
        names.append("doc_ids")
    return names


def _rotated(spec: LayerSpec, x: Any, weight: Any, positions: Any) -> Any:
    if spec.norm_eps is not None:
        x = af.qk_norm(x, weight, eps=spec.norm_eps)
    return af.rope(x, theta=spec.theta, scaling=spec.scaling_dict(), positions=positions)


def _masked(spec: LayerSpec, s: Any, mask: str, a: dict[str, Any]) -> Any:
    s = af.mask(s, af.causal if spec.window is None else af.sliding_window(spec.window))
    if mask == "padded":
        key_ok = a["key_ok"]
        s = af.mask(s, lambda b, h, q_idx, kv_idx: key_ok[b, kv_idx])
    elif mask == "packed":
        s = af.mask(s, af.document(a["doc_ids"]))
    return s


@functools.cache
def variant(spec: LayerSpec, cached: bool, mask: str) -> af.Variant:
    """The AttnFuse variant of a layer: `cached` False rotates q and k in the kernel (arguments
    q, k, v, q_positions, k_positions, ...), True only q (k comes rotated from the cache); `mask`
    is "causal" (plain causal or windowed), "padded" (and a bool key mask `key_ok` [B, Nk]),
    "packed" (and document ids `doc_ids` [B, Nk]) or "varlen" (q, k, v only, for `Variant.varlen`:
    positions within each packed sequence). Built once per arguments."""
    names = _argument_names(spec, cached, mask)

    def attention(*args: Any) -> Any:
        a = dict(zip(names, args, strict=True))
        q = _rotated(spec, a["q"], a.get("q_norm_weight"), a.get("q_positions"))
        k = a["k"] if cached else _rotated(spec, a["k"], a.get("k_norm_weight"), a.get("k_positions"))
        s = af.qk(q, k, scale=spec.scale)
        if spec.softcap is not None:
            s = af.softcap(s, spec.softcap)
        s = _masked(spec, s, mask, a)
        return af.pv(af.softmax(s, sink=a.get("sinks")), a["v"])

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    attention.__signature__ = inspect.Signature([inspect.Parameter(n, kind) for n in names])  # type: ignore[attr-defined]
    return af.Variant(attention, name="hf_cached" if cached else "hf_fused")


# --------------------------------------------------------------------------- keys written to the cache


def _cached_keys(module: Any, spec: LayerSpec, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    if spec.norm_eps is not None:
        k = module.k_norm(k)
    return rotate(spec, k, positions)


# --------------------------------------------------------------------------- the patched forward


def _cache_of(kwargs: dict[str, Any]) -> Any:
    """The cache argument: `cache` in transformers >= 5.2x, `past_key_values` before."""
    cache = kwargs.pop("cache", None)
    legacy = kwargs.pop("past_key_values", None)
    return legacy if cache is None else cache


def _cache_layer(cache: Any, layer_idx: int) -> Any:
    layers = getattr(cache, "layers", None)
    return layers[layer_idx] if layers is not None and layer_idx < len(layers) else cache


def _check_cache_layer(layer: Any, layer_idx: int) -> None:
    """A layer of the dynamic cache or a full-attention layer of the static cache; anything else is
    an `AttnFuseError` naming it."""
    if isinstance(layer, StaticLayer) and layer.is_sliding:
        raise AttnFuseError(
            f"attnfuse.integrations.transformers does not read a static cache's sliding-window layers "
            f"({type(layer).__name__} at layer {layer_idx}: a rolling buffer of the last keys, not the keys by "
            "position); use the dynamic cache (the default) for a model with sliding windows"
        )
    if not isinstance(layer, (DynamicLayer, StaticLayer)):
        paged = " (continuous batching, generate_batch, is not supported)" if "Paged" in type(layer).__name__ else ""
        raise AttnFuseError(
            f"attnfuse.integrations.transformers supports dynamic caches (DynamicCache) and static caches "
            f"(StaticCache, cache_implementation='static'), got {type(layer).__name__} at layer {layer_idx}{paged}"
        )


def _positions(
    position_ids: torch.Tensor | None, past: int | torch.Tensor, b: int, n: int, device: torch.device
) -> torch.Tensor:
    """RoPE positions for the n new tokens: `position_ids` ([B, N]; a [1, N] shared by a batch
    as [N]), or past..past+n-1 without them (transformers' default). Read at every call, never
    cached: a generation loop may refill one tensor in place."""
    if position_ids is None:
        return torch.arange(n, device=device) + past
    if position_ids.dim() == 2 and position_ids.shape[0] == 1 and b != 1:
        return position_ids[0]
    return position_ids


def _mask(attention_mask: object) -> tuple[str, torch.Tensor | None]:
    """The mask kind of a layer's `attention_mask`, which is what `_layer_mask` made of the model's:
    None ("causal", None), a bool key mask [B, Nk] ("padded", it) or integer document ids [B, N]
    ("packed", them)."""
    if attention_mask is None:
        return "causal", None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 2:
        raise AttnFuseError(
            "attnfuse.integrations.transformers takes a 2-D padding attention_mask [B, N] (or none); "
            f"got {type(attention_mask).__name__} of shape {list(getattr(attention_mask, 'shape', []))}: "
            "a 4-D or block mask is not supported"
        )
    if attention_mask.dtype == torch.bool:
        return "padded", attention_mask
    return "packed", attention_mask


def _extras(module: Any, spec: LayerSpec, cached: bool, mask_arg: torch.Tensor | None) -> list[torch.Tensor]:
    extras: list[torch.Tensor] = []
    if spec.norm_eps is not None:
        extras += [module.q_norm.weight] if cached else [module.q_norm.weight, module.k_norm.weight]
    if spec.sinks:
        extras.append(module.sinks)
    if mask_arg is not None:
        extras.append(mask_arg)
    return extras


def _check_call(module: Any, kwargs: dict[str, Any]) -> None:
    if module.training and module.attention_dropout > 0:
        raise AttnFuseError(
            f"attnfuse.integrations.transformers does not support attention dropout in training "
            f"({type(module).__name__}.attention_dropout = {module.attention_dropout}); set config.attention_dropout "
            "to 0 or call model.eval()"
        )
    # As transformers decides it: the call's output_attentions, else the config's.
    if kwargs.get("output_attentions", getattr(getattr(module, "config", None), "output_attentions", False)):
        raise AttnFuseError(
            "attnfuse.integrations.transformers does not materialise attention weights, so output_attentions=True "
            "(in the call or in config.output_attentions) cannot be honoured: call the model without it, or load a "
            "model that is not patched by apply, with attn_implementation='eager', to inspect attention weights"
        )


def _attend(
    module: Any,
    variants: dict[tuple[bool, str], af.Variant],
    spec: LayerSpec,
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    attention_mask: object,
    cache: Any,
    position_ids: torch.Tensor | None,
) -> torch.Tensor:
    """The attention output [B, Hq, N, D] of the new tokens' q, k, v [B, H, N, D]."""
    q, k, v = qkv
    b, n = q.shape[0], q.shape[2]
    layer_idx = module.layer_idx
    mask, mask_arg = _mask(attention_mask)
    if cache is not None and not hasattr(cache, "layers"):  # not a Cache of layers: paged, legacy tuples, ...
        _check_cache_layer(cache, layer_idx)
    if cache is not None and isinstance(_cache_layer(cache, layer_idx), StaticLayer):
        return _attend_static(module, variants, spec, qkv, (mask, mask_arg), cache, position_ids)
    past = 0 if cache is None else cache.get_seq_length(layer_idx)
    positions = _positions(position_ids, past, b, n, q.device)
    cached = past > 0
    if cache is not None:
        rotated, v_all = cache.update(_cached_keys(module, spec, k, positions), v, layer_idx)
        _check_cache_layer(_cache_layer(cache, layer_idx), layer_idx)
        if cached:
            k, v = rotated, v_all
    _check_mask_width(mask, mask_arg, k.shape[2], layer_idx)
    extras = _extras(module, spec, cached, mask_arg)
    if mask == "packed" and cache is None and not torch.compiler.is_compiling():
        return _packed(variants[False, VARLEN], (q, k, v), mask_arg, _extras(module, spec, False, None))
    if cached and _decodes(mask, n, (q, k, v, extras)):
        # Decoding a few tokens against the cache: the split-KV decode kernels (the cache holds
        # the first Nk positions of every sequence, the new tokens the last n).
        seqlens = torch.full((b,), k.shape[2], dtype=torch.int32, device=q.device)
        return variants[cached, mask].decode(q, k, v, seqlens, positions, *extras, check=False)
    head = (q, k, v, positions) if cached else (q, k, v, positions, positions)
    return variants[cached, mask](*head, *extras)


def _attend_static(
    module: Any,
    variants: dict[tuple[bool, str], af.Variant],
    spec: LayerSpec,
    qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    mask_kind: tuple[str, torch.Tensor | None],
    cache: Any,
    position_ids: torch.Tensor | None,
) -> torch.Tensor:
    """`_attend` with a static cache (transformers' StaticCache: buffers [B, Hkv, max_cache_len, D]
    written in place, the length a device tensor). The rotated keys are written at the cache's
    length. Up to 16 new tokens needing no gradient run the decode kernels with the length read
    on the device, so a compiled step captured in a CUDA graph replays. A longer call (the
    prefill, which generate() runs uncompiled) reads the length once on the host and runs the
    fused variant on an empty cache, else the cached one on the keys written so far."""
    q, k, v = qkv
    mask, mask_arg = mask_kind
    b, n = q.shape[0], q.shape[2]
    layer_idx = module.layer_idx
    layer = _cache_layer(cache, layer_idx)
    if layer_idx == 0:  # every layer checked before the first is written
        for i, each in enumerate(getattr(cache, "layers", [layer])):
            _check_cache_layer(each, i)
    past = layer.cumulative_length if layer.is_initialized else 0
    positions = _positions(position_ids, past, b, n, q.device)
    keys, values = cache.update(_cached_keys(module, spec, k, positions), v, layer_idx)
    _check_mask_width(mask, mask_arg, keys.shape[2], layer_idx)
    extras = _extras(module, spec, True, mask_arg)
    if _decodes(mask, n, (q, keys, values, extras)):
        lengths = layer.cumulative_length.to(device=q.device, dtype=torch.int32).expand(b)
        return variants[True, mask].decode(q, keys, values, lengths, positions, *extras, check=False)
    if torch.compiler.is_compiling():
        raise AttnFuseError(
            f"with a static cache under torch.compile, AttnFuse runs calls of up to {inference.MAX_DECODE_QUERIES} "
            f"new tokens needing no gradient (the decode kernels, the cache's length read on the device); this "
            f"call has {n} tokens{' and needs a gradient' if _needs_grad(q, k, v, extras) else ''}: run the prefill "
            "uncompiled (as generate() does) or in chunks of at most 16 tokens"
        )
    end = int(layer.cumulative_length)  # one host read, in an uncompiled call
    key_ok = None if mask_arg is None else mask_arg[:, :end]
    if end == n:  # the cache was empty: q and k rotated in the kernel
        return variants[False, mask](q, k, v, positions, positions, *_extras(module, spec, False, key_ok))
    extras = _extras(module, spec, True, key_ok)
    return variants[True, mask](q, keys[:, :, :end], values[:, :, :end], positions, *extras)


def _check_mask_width(mask: str, mask_arg: torch.Tensor | None, keys: int, layer_idx: int) -> None:
    if mask_arg is not None and mask_arg.shape[-1] != keys:
        what = "attention_mask" if mask == "padded" else "the packed sequences' document ids"
        raise AttnFuseError(f"{what} cover {mask_arg.shape[-1]} keys but layer {layer_idx} attends to {keys}")


def _decodes(mask: str, n: int, tensors: tuple[Any, ...]) -> bool:
    """Whether a call extending a cache runs the decode kernels: up to 16 new tokens, a causal
    (or windowed) or padded mask, no gradient."""
    return mask in ("causal", "padded") and n <= inference.MAX_DECODE_QUERIES and not _needs_grad(*tensors)


def _packed(
    varlen: af.Variant, qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor], doc_ids: Any, extras: list[Any]
) -> torch.Tensor:
    """Packed sequences (the rows' documents, `doc_ids` [B, N]) through `Variant.varlen`: every
    document of every row one sequence, no tile spanning two; [B, Hq, N, Dv]. RoPE rotates at
    positions within each document, which gives the scores of the model's own positions when
    they count up by one within a document (RoPE depends on position differences only)."""
    q, k, v = qkv
    b, hq, n, _ = q.shape
    starts = torch.ones((b, n), dtype=torch.bool, device=q.device)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    first = starts.flatten().nonzero().flatten()
    cu = torch.cat([first, first.new_full((1,), b * n)]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    rows = [t.transpose(1, 2).reshape(b * n, t.shape[1], t.shape[3]) for t in (q, k, v)]
    out = varlen.varlen(rows[0], rows[1], rows[2], cu, cu, longest, longest, *extras, check=False)
    return out.view(b, n, hq, -1).transpose(1, 2)


def _needs_grad(*tensors: Any) -> bool:
    flat = [t for x in tensors for t in (x if isinstance(x, list) else [x])]
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat)


class PatchedAttention:
    """The forward `apply` installs on an attention module (as `module.forward`): projections, then
    one AttnFuse variant with RoPE (and QK-norm) inside, then o_proj; returns (output, None), no
    attention weights. It holds the module, its `LayerSpec` and its variants, one per (cached,
    mask kind). Pickled or deep-copied as (module, spec): the variants are rebuilt (and shared
    through `variant`'s cache), so a patched model pickles."""

    def __init__(self, module: torch.nn.Module, spec: LayerSpec):
        self.module: Any = module  # an attention module of a supported family (q_proj, ..., o_proj)
        self.spec = spec
        # Built here, not on first call: a call traced by torch.compile finds them ready.
        self.variants = {(c, m): variant(spec, c, m) for c in (False, True) for m in _MASKS}
        self.variants[False, VARLEN] = variant(spec, False, VARLEN)

    def __reduce__(self) -> tuple[Any, ...]:
        return PatchedAttention, (self.module, self.spec)

    def __call__(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: object = None,
        attention_mask: object = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        module, spec = self.module, self.spec
        cache = _cache_of(kwargs)
        _check_call(module, kwargs)
        b, n = hidden_states.shape[:2]
        shape = (b, n, -1, spec.head_dim)
        q = module.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = module.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = module.v_proj(hidden_states).view(shape).transpose(1, 2)
        out = _attend(module, self.variants, spec, (q, k, v), attention_mask, cache, kwargs.get("position_ids"))
        return module.o_proj(out.transpose(1, 2).reshape(b, n, -1)), None


# --------------------------------------------------------------------------- registration and apply


def _unpatched_attention(module: Any, *args: Any, **kwargs: Any) -> Any:
    """The "attnfuse" entry of transformers' AttentionInterface: reached only by an attention
    module `apply` did not patch."""
    raise AttnFuseError(
        f"{type(module).__name__} was not patched by attnfuse.integrations.transformers.apply, yet the model's "
        f"attention implementation is {ATTN_IMPLEMENTATION!r}"
    )


def _documents(mask_function: Any, batch_size: int, length: int, device: Any) -> torch.Tensor | None:
    """The document ids [B, length] (int64, 0 for each row's first document) that transformers'
    `mask_function` of a call without cache implies: a new document starts at every token that
    may not attend to the one before it. None when there is one document per row, which is known
    only outside torch.compile (as in transformers, whose packing check is data-dependent)."""
    rows = torch.arange(batch_size, device=device)[:, None]
    later = torch.arange(1, length, device=device)[None]
    head = torch.zeros((), dtype=torch.long, device=device)
    joined = torch.as_tensor(mask_function(rows, head, later, later - 1)).to(device).expand(batch_size, length - 1)
    if not torch.compiler.is_compiling() and bool(joined.all()):
        return None
    starts = torch.cat([torch.zeros(batch_size, 1, dtype=torch.bool, device=device), ~joined], dim=-1)
    return starts.cumsum(-1)


def _layer_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: object = 0,
    kv_offset: object = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    allow_is_causal_skip: bool = False,
    device: Any = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The "attnfuse" entry of transformers' AttentionMaskInterface: what a layer's variant needs
    beyond causality and windows (the variant's own business), decided where transformers decides
    it, once per forward:

    - a 2-D `attention_mask` given: its bool key mask [B, kv_length] of the keys a layer attends
      to (a static cache's slots past the mask, not yet written, masked), or None when it masks
      nothing, which is decided outside torch.compile only (never packing: transformers infers
      packed sequences only without a mask);
    - no mask: the document ids [B, N] of packed sequences (`_documents`) when transformers' mask
      function says so (no cache, positions restarting or jumping; transformers then turns its
      `allow_is_causal_skip` off), else None."""
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:].to(torch.bool)
        if not torch.compiler.is_compiling() and bool(attention_mask.all()):
            return None
        if attention_mask.shape[1] < kv_length:  # a static cache's slots past the mask: not written yet
            attention_mask = torch.nn.functional.pad(attention_mask, (0, kv_length - attention_mask.shape[1]))
        return attention_mask
    fresh = q_length == kv_length and all(isinstance(x, int) and x == 0 for x in (q_offset, kv_offset))
    if allow_is_causal_skip or mask_function is None or not fresh or q_length < 2:
        return None
    return _documents(mask_function, batch_size, q_length, device)


def _register() -> None:
    AttentionInterface.register(ATTN_IMPLEMENTATION, _unpatched_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _layer_mask)


# At import, not only in `apply`: a patched model unpickled in another process needs them, and
# unpickling it imports this module.
_register()


def _attention_modules(model: torch.nn.Module, family: Family, config: Any) -> list[Any]:
    modules = [m for m in model.modules() if type(m).__name__ == family.attention]
    layers = [getattr(m, "layer_idx", None) for m in modules]
    if sorted(i for i in layers if isinstance(i, int)) != list(range(config.num_hidden_layers)):
        raise AttnFuseError(
            f"expected one {family.attention} per layer (layers 0..{config.num_hidden_layers - 1}), found layers "
            f"{layers}"
        )
    return modules


def _check_version() -> None:
    major = int(transformers.__version__.split(".")[0])
    if major != 5:
        raise AttnFuseError(
            f"attnfuse.integrations.transformers supports transformers 5.x, found {transformers.__version__}"
        )


def _own_config(model: torch.nn.Module) -> Any:
    """Give `model` its own copy of its config (and of the sub-configs it holds), and return it:
    transformers shares the config object a model was built from with every other model built
    from it, and setting the attention implementation writes to it."""
    copies: dict[int, Any] = {}
    copy.deepcopy(model.config, copies)
    for module in model.modules():
        config = module.__dict__.get("config")
        if config is not None and id(config) in copies:
            module.config = copies[id(config)]
    return model.config


def apply(model: Any) -> Any:
    """Patch the Hugging Face model `model` in place so that every attention layer runs one
    AttnFuse variant with RoPE (and Qwen3's QK-norm) inside the kernel; returns `model`.

    Supported: Llama (default, linear, llama3 and yarn rope), Mistral, Qwen2, Qwen3, Gemma 2 and
    gpt-oss (`config.model_type` llama, mistral, qwen2, qwen3, gemma2, gpt_oss), with their
    sliding windows, softcap, QK-norm and sinks read from the config and the layers. The model's
    attention implementation becomes "attnfuse". Padding masks, `position_ids`, packed sequences,
    training and `generate()` with the dynamic or the static cache (compiled) work. Anything else raises
    `AttnFuseError` naming it, before the model is changed."""
    _check_version()
    config = getattr(model, "config", None)
    set_implementation = getattr(model, "set_attn_implementation", None)
    if not isinstance(model, torch.nn.Module) or config is None or set_implementation is None:
        raise AttnFuseError(f"apply expects a transformers PreTrainedModel, got {type(model).__name__}")
    family = family_of(config)
    check_config(config)
    modules = _attention_modules(model, family, config)
    specs = [layer_spec(config, m, m.layer_idx) for m in modules]
    config = _own_config(model)
    set_implementation(ATTN_IMPLEMENTATION)
    if config._attn_implementation != ATTN_IMPLEMENTATION:
        raise AttnFuseError(
            f"{type(model).__name__} refused the attention implementation {ATTN_IMPLEMENTATION!r} "
            f"(it kept {config._attn_implementation!r})"
        )
    for module, spec in zip(modules, specs, strict=True):
        module._attnfuse_spec = spec
        module.forward = PatchedAttention(module, spec)
    return model
