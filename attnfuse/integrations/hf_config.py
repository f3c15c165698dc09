"""What `attnfuse.integrations.transformers` reads from a Hugging Face model's config: the
supported families (`FAMILIES`), RoPE's theta and scaling (`rope_from_config`) and each attention
layer's `LayerSpec` (`layer_spec`). Plain attribute reads on the config object: transformers is
not imported here."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

import attnfuse as af
from attnfuse.errors import AttnFuseError

__all__ = ["FAMILIES", "Family", "LayerSpec", "check_config", "family_of", "layer_spec", "rope_from_config"]


# --------------------------------------------------------------------------- families


@dataclasses.dataclass(frozen=True)
class Family:
    """What one model type's attention module holds: its class name, whether it has Qwen3's
    q_norm/k_norm, Gemma 2's softcap and query_pre_attn_scalar, gpt-oss's sinks, and where its
    sliding windows come from ("none", "config": `config.sliding_window` on every layer, or
    "layer_types": `config.sliding_window` on the layers whose type is "sliding_attention")."""

    attention: str
    qk_norm: bool = False
    gemma: bool = False
    sinks: bool = False
    windows: str = "none"


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaAttention"),
    "mistral": Family("MistralAttention", windows="config"),
    "qwen2": Family("Qwen2Attention", windows="layer_types"),
    "qwen3": Family("Qwen3Attention", qk_norm=True, windows="layer_types"),
    "gemma2": Family("Gemma2Attention", gemma=True, windows="layer_types"),
    "gpt_oss": Family("GptOssAttention", sinks=True, windows="layer_types"),
}
"""The supported `config.model_type`s."""

_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """The attention of one layer, as read from the config: RoPE's theta, scaling (kind and
    AttnFuse's parameters, or None) and rotary dim, the score scale, QK-norm's eps (None: no
    QK-norm), the logit softcap, the sliding window (None: full causal) and whether the
    softmax has learned sinks."""

    head_dim: int
    theta: float
    scaling_kind: str | None
    scaling: tuple[tuple[str, float | bool], ...]
    scale: float
    norm_eps: float | None = None
    softcap: float | None = None
    window: int | None = None
    sinks: bool = False

    def scaling_dict(self) -> dict[str, Any] | None:
        """The scaling as `af.rope(scaling=...)` takes it."""
        return None if self.scaling_kind is None else {"rope_type": self.scaling_kind, **dict(self.scaling)}


def family_of(config: Any) -> Family:
    """The `Family` of `config.model_type`; another model type raises `AttnFuseError`."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise AttnFuseError(
            f"attnfuse.integrations.transformers does not support model type {model_type!r} "
            f"({type(config).__name__}); supported: {', '.join(FAMILIES)}"
        )
    return FAMILIES[model_type]


def check_config(config: Any) -> None:
    """Options the integration does not handle, whatever the family."""
    unsupported = {
        "is_encoder_decoder": "cross-attention (an encoder-decoder model)",
        "add_cross_attention": "cross-attention",
        "use_bidirectional_attention": "bidirectional attention",
    }
    for key, what in unsupported.items():
        if getattr(config, key, False):
            raise AttnFuseError(f"attnfuse.integrations.transformers does not support {what}: config.{key} is set")
    if not getattr(config, "is_causal", True):
        raise AttnFuseError(
            "attnfuse.integrations.transformers supports causal attention only: config.is_causal is False"
        )


# --------------------------------------------------------------------------- rope from the config


def _require(params: dict[str, Any], kind: str, key: str) -> None:
    if params.get(key) is None:
        raise AttnFuseError(
            f"config.rope_parameters of rope_type {kind!r} needs {key!r}, which it lacks (it has "
            f"{', '.join(sorted(map(repr, params))) or 'no keys'})"
        )


def _yarn_params(params: dict[str, Any], config: Any) -> dict[str, Any]:
    """transformers' YaRN defaults made explicit: a missing factor is max_position_embeddings /
    original_max_position_embeddings, missing betas 32 and 1, and a missing attention_factor
    comes from factor (and mscale / mscale_all_dim, when both are given)."""
    params = dict(params)
    _require(params, "yarn", "original_max_position_embeddings")
    if params.get("factor") is None:
        params["factor"] = config.max_position_embeddings / params["original_max_position_embeddings"]
    params["beta_fast"] = params.get("beta_fast") or 32.0
    params["beta_slow"] = params.get("beta_slow") or 1.0
    mscale, mscale_all_dim = params.pop("mscale", None), params.pop("mscale_all_dim", None)
    if params.get("attention_factor") is None:
        factor = float(params["factor"])

        def get_mscale(m: float) -> float:
            return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

        both = bool(mscale) and bool(mscale_all_dim)
        params["attention_factor"] = get_mscale(mscale) / get_mscale(mscale_all_dim) if both else get_mscale(1.0)
    return params


def _rope_parameters(config: Any) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or "rope_theta" not in params:
        raise AttnFuseError(
            f"attnfuse.integrations.transformers needs config.rope_parameters with a rope_theta, got {params!r} "
            "(per-layer-type rope parameters are not supported)"
        )
    return dict(params)


def rope_from_config(config: Any) -> tuple[float, str | None, tuple[tuple[str, float | bool], ...]]:
    """(theta, scaling kind or None, AttnFuse's scaling parameters) of `config.rope_parameters`.
    Unknown rope types and a partial rotary factor raise `AttnFuseError`."""
    params = _rope_parameters(config)
    theta = float(params.pop("rope_theta"))
    partial = params.pop("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise AttnFuseError(
            f"attnfuse.integrations.transformers does not support partial rotary embeddings "
            f"(config partial_rotary_factor={partial})"
        )
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", "linear", "llama3", "yarn"):
        raise AttnFuseError(
            f"attnfuse.integrations.transformers does not support rope type {kind!r} "
            "(supported: default, linear, llama3, yarn)"
        )
    if kind == "default":
        return theta, None, ()
    if kind == "yarn":
        params = _yarn_params(params, config)
    else:
        _require(params, kind, "factor")
    try:
        attr = af.rope_scaling(params)
    except AttnFuseError as e:
        raise AttnFuseError(f"config.rope_parameters: {e}") from None
    assert attr is not None
    return theta, kind, tuple(sorted(attr.values.items()))


# --------------------------------------------------------------------------- one layer's spec


def _window(config: Any, family: Family, layer_idx: int) -> int | None:
    window = None
    if family.windows == "config":
        window = getattr(config, "sliding_window", None)
    elif family.windows == "layer_types":
        layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        layer_type = layer_types[layer_idx]
        if layer_type not in _LAYER_TYPES:
            raise AttnFuseError(
                f"attnfuse.integrations.transformers does not support layer type {layer_type!r} (layer {layer_idx}); "
                f"supported: {', '.join(_LAYER_TYPES)}"
            )
        window = config.sliding_window if layer_type == "sliding_attention" else None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise AttnFuseError(f"config.sliding_window must be a positive integer, got {window!r}")
    return window


def _head_dim(config: Any, module: torch.nn.Module) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q_proj = getattr(module, "q_proj", None)
    if not isinstance(q_proj, torch.nn.Linear) or q_proj.out_features != config.num_attention_heads * head_dim:
        raise AttnFuseError(
            f"{type(module).__name__}: expected a q_proj Linear with num_attention_heads * head_dim = "
            f"{config.num_attention_heads} * {head_dim} outputs"
        )
    return int(head_dim)


def layer_spec(config: Any, module: torch.nn.Module, layer_idx: int) -> LayerSpec:
    """The `LayerSpec` of the attention module of layer `layer_idx`, read from `config`."""
    family = family_of(config)
    head_dim = _head_dim(config, module)
    theta, kind, scaling = rope_from_config(config)
    scale = head_dim**-0.5
    softcap = None
    if family.gemma:
        scale = float(config.query_pre_attn_scalar) ** -0.5
        cap = config.attn_logit_softcapping
        softcap = None if cap is None else float(cap)
    return LayerSpec(
        head_dim=head_dim,
        theta=theta,
        scaling_kind=kind,
        scaling=scaling,
        scale=scale,
        norm_eps=float(config.rms_norm_eps) if family.qk_norm else None,
        softcap=softcap,
        window=_window(config, family, layer_idx),
        sinks=family.sinks,
    )
