"""The `triton` target: `printer.py` prints `tl` modules as Python source of Triton
kernels; `prelude.py` is the runtime support copied into every generated module."""
