"""AttnFuse: a small compiler for attention."""

__version__ = "0.1.0"
