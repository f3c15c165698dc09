"""Stand-ins for `attnfuse.compiler.compile_module` that test the runtime's cache and
loading machinery without the Triton lowering: they return generated modules of the
same shape (a Python file defining `launch(q, k, v, *extras, lse=None) -> (out, lse)`).

- `reference_compile`: `launch` runs the reference executor on the IR the module
  carries (correct results, so cache tests can check outputs too);
- `trivial_compile`: `launch` returns q itself, to time the runtime's own overhead.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

REFERENCE_SOURCE = '''"""Stand-in generated module (python_tests/stub_compiler.py)."""
import os

import torch

from attnfuse.ir import parse_module
from attnfuse.reference import run_reference_with_lse

IMPORTED_WITH_TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET")
SM = {sm!r}
SEQ_LEN = {seq_len!r}
_MODULE = parse_module({ir!r})


def launch(q, k, v, *extras, lse=None):
    out, lse = run_reference_with_lse(_MODULE, q, k, v, *extras, compute_dtype=torch.float32)
    return out.to(q.dtype), lse.float()
'''

TRIVIAL_SOURCE = '''"""Stand-in generated module whose launch does no work."""


def launch(q, k, v, *extras, lse=None):
    return q, None
'''


def _params(seq_len):
    return {"attn_fwd": {"grid": [1, 1], "num_warps": 4, "num_stages": 1, "constexprs": {"SEQ_LEN": seq_len}}}


def reference_compile(module, *, sm=None, seq_len=None, delay=0.0):
    if delay:
        time.sleep(delay)
    source = REFERENCE_SOURCE.format(ir=str(module), sm=sm, seq_len=seq_len)
    return SimpleNamespace(source=source, launch_params=_params(seq_len))


def trivial_compile(module, *, sm=None, seq_len=None):
    return SimpleNamespace(source=TRIVIAL_SOURCE, launch_params=_params(seq_len))


def failing_compile(module, *, sm=None, seq_len=None):
    raise AssertionError("the runtime compiled a kernel it should have found in the cache")
