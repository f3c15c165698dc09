"""The keys a Hugging Face layer writes to its KV cache under `attnfuse.integrations.transformers`:
K rotated ("half"-style RoPE) at the tokens' positions with exactly the frequencies the kernels
use (`attnfuse.rope_freqs`), in float32, returned in K's dtype. Does not import transformers."""

from __future__ import annotations

import torch

from attnfuse.integrations.hf_config import LayerSpec
from attnfuse.rope_freqs import inv_freq as _rope_inv_freq

__all__ = ["rotate"]


_FREQUENCIES: dict[tuple[LayerSpec, torch.device], tuple[torch.Tensor, float]] = {}


def _frequencies(spec: LayerSpec, device: torch.device) -> tuple[torch.Tensor, float]:
    """RoPE's inverse frequencies (float32 [head_dim / 2], on `device`) and cos/sin magnitude,
    exactly those the kernels use (`attnfuse.rope_freqs`). Kept per device, so an eager decoding
    step copies nothing from the host; inside torch.compile they are built in the graph."""
    found = _FREQUENCIES.get((spec, device))
    if found is None:
        freqs, magnitude = _rope_inv_freq(spec.theta, spec.head_dim, spec.scaling_kind, **dict(spec.scaling))
        found = (torch.tensor(freqs, dtype=torch.float32, device=device), magnitude)
        if not torch.compiler.is_compiling():  # a compiled graph's tensor is not kept (CUDA-graph pools)
            _FREQUENCIES[spec, device] = found
    return found


_LAST_ANGLES: dict[tuple[LayerSpec, torch.device], tuple[torch.Tensor, int, torch.Tensor, torch.Tensor]] = {}


def _cos_sin(spec: LayerSpec, positions: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation's factors at `positions` over the whole head dim (float32, scaled):
    [cos, cos] and [-sin, sin]. Reused while the same positions tensor, unchanged, comes back:
    every layer of one forward gets the model's one `position_ids`. The entry holds the tensor
    itself, so a new tensor at a reused address is never a hit; inside torch.compile nothing is
    kept."""
    compiling = torch.compiler.is_compiling()
    last = None if compiling else _LAST_ANGLES.get((spec, device))
    if last is not None and last[0] is positions and last[1] == positions._version:
        return last[2], last[3]
    freqs, magnitude = _frequencies(spec, device)
    angle = positions.to(torch.float32)[..., None] * freqs
    if angle.dim() == 3:
        angle = angle[:, None]
    cos, sin = torch.cos(angle) * magnitude, torch.sin(angle) * magnitude
    cos2, sin2 = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)
    if not compiling:
        _LAST_ANGLES[spec, device] = (positions, positions._version, cos2, sin2)
    return cos2, sin2


def rotate(spec: LayerSpec, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x [B, H, N, D] rotated ("half" style) at `positions` ([B, N] or [N]) with the layer's
    frequencies, computed in float32 and returned in x's dtype: the keys a cache holds. The
    halves swapped by one roll, so that a rotation is five tensor ops."""
    cos2, sin2 = _cos_sin(spec, positions, x.device)
    xf = x.float()
    return torch.addcmul(xf * cos2, xf.roll(spec.head_dim // 2, dims=-1), sin2).to(x.dtype)
