"""Integrations of AttnFuse with model libraries.

- `attnfuse.integrations.transformers`: `apply(model)` makes a Hugging Face transformers 5.x model run
  every attention layer as one AttnFuse variant, RoPE (and QK-norm) inside the kernel. Needs the
  `hf` extra (`pip install 'attnfuse[hf]'`). What it reads from a model's config (families, RoPE,
  each layer's `LayerSpec`) is `attnfuse.integrations.hf_config`, and the keys its layers write to
  the KV cache `attnfuse.integrations.hf_rope`; neither imports transformers.

Nothing here is imported by `import attnfuse`: each integration imports its library only when it is
imported itself.
"""
