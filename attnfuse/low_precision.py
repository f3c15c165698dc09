"""The FP8 form's arithmetic, as the reference executor computes it: the Hadamard rotation of
`attn.hadamard` and the e4m3 quantization of `attn.quantize`.

- `hadamard_matrix(d, seed)`: M = diag(s) H / sqrt(d), H the Sylvester Hadamard matrix
  (H_1 = [1], H_2n = [[H, H], [H, -H]]) and s the ±1 signs `random_signs(d, seed)` draws from
  torch's CPU generator seeded with `seed`. M is orthogonal (M Mᵀ = I), so (q M)(k M)ᵀ = q kᵀ.
- `quantize_e4m3(x, block)`: x [B, H, N, D] as float8 e4m3 holds it, dequantized: per block of
  `block` rows of one (batch, head) (0: the whole tensor), scale = the block's largest magnitude
  / 448 (1 for an all-zero block), then scale * e4m3(x / scale), rounded to nearest even.
"""

from __future__ import annotations

import math

import torch

from attnfuse.dialects.attn import E4M3_MAX
from attnfuse.errors import AttnFuseError


def random_signs(d: int, seed: int) -> torch.Tensor:
    """The ±1 signs (float64 [d]) of `attn.hadamard` with this seed."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, (d,), generator=g) * 2 - 1).to(torch.float64)


def hadamard_matrix(
    d: int, seed: int = 0, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
) -> torch.Tensor:
    """The orthogonal [d, d] matrix M that `af.hadamard(x, seed=seed)` multiplies x by (x @ M)."""
    if not isinstance(d, int) or d < 1 or d & (d - 1):
        raise AttnFuseError(f"hadamard_matrix: d must be a power of two, got {d!r}")
    if not isinstance(seed, int) or seed < 0:
        raise AttnFuseError(f"hadamard_matrix: seed must be an integer >= 0, got {seed!r}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    m = random_signs(d, seed)[:, None] * h / math.sqrt(d)
    return m.to(dtype=dtype, device=device)


def quantize_e4m3(x: torch.Tensor, block: int) -> torch.Tensor:
    """x [B, H, N, D] rounded as float8 e4m3 with one scale per `block` rows of a (batch, head)
    (per tensor for `block` 0), returned dequantized in x's dtype (see the module docstring)."""
    if x.numel() == 0:
        return x.clone()
    if block == 0:
        groups = x.reshape(1, -1)
    else:
        b, h, n, d = x.shape
        pad = -n % block
        padded = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
        groups = padded.reshape(b * h * ((n + pad) // block), block * d)
    amax = groups.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    rounded = (groups / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(x.dtype) * scale
    if block == 0:
        return rounded.reshape(x.shape)
    b, h, n, d = x.shape
    return rounded.reshape(b, h, -1, d)[:, :, :n]
