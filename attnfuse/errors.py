"""Errors AttnFuse raises at its users."""

from __future__ import annotations


class AttnFuseError(ValueError):
    """Bad input to AttnFuse: a tensor of the wrong shape, dtype or device, an unknown
    backend, a variant the `attn` dialect cannot express, or a traced Python construct
    that has no IR meaning. The message names the argument (or op) and what was
    expected."""
