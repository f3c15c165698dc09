"""`generate()` of a patched Hugging Face model on the GPU with a static cache (issue 23), which
transformers compiles for the decoding steps (torch.compile, mode "reduce-overhead": CUDA graphs;
here with `fullgraph=True`, so a graph break fails): a small random Llama in bf16, unpadded and
left-padded, against the same patched model's uncompiled dynamic-cache `generate()`. What AttnFuse
first builds and keeps inside the CUDA-graph warm-up (a decode signature, a RoPE table, the lse
workspace) must stay out of the graph's memory pool, or torch raises at the capture."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402
from transformers import CompileConfig  # noqa: E402

import attnfuse as af  # noqa: E402
from attnfuse import launch  # noqa: E402
from attnfuse.integrations.transformers import PatchedAttention, apply  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

VOCAB = 512


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        initializer_range=0.2,
        pad_token_id=0,
    )
    return apply(transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval())


def _rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def test_static_cache_generate_compiled():
    model = _model()
    cached = [v for (is_cached, _), v in next(
        m.forward for m in model.modules() if isinstance(getattr(m, "forward", None), PatchedAttention)
    ).variants.items() if is_cached]  # fmt: skip
    ids = torch.randint(3, VOCAB, (2, 300), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :37] = 0
    kw = dict(max_new_tokens=12, do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    compiled = CompileConfig(fullgraph=True)

    def static() -> transformers.StaticCache:
        # A capacity no eager call has seen: the decode signature, its RoPE table's length bucket
        # and (cleared) the lse workspace are first built inside the CUDA-graph warm-up, and must
        # stay out of the graph's memory pool.
        launch.LSE_WORKSPACES.clear()
        return transformers.StaticCache(config=model.config, max_cache_len=600)

    def agreeing(a, b) -> int:  # new tokens equal in both runs, up to the first that differs
        new_a, new_b = (x.sequences[:, ids.shape[1] :] for x in (a, b))
        return int((new_a == new_b).all(0).long().cumprod(0).sum().item())

    with af.backend("triton"):
        for call in (dict(inputs=ids), dict(inputs=ids, attention_mask=mask)):
            dynamic = model.generate(**call, **kw)
            # The static cache uncompiled: the same kernels on the same inputs as the dynamic one
            # (only the split of the cache may differ, with its capacity).
            eager = model.generate(**call, **kw, past_key_values=static(), disable_compile=True)
            agree = agreeing(eager, dynamic)
            assert agree >= 1
            for step in range(agree):
                assert _rel_l2(eager.scores[step], dynamic.scores[step]) < 1e-2, step
            for v in cached:
                v._decode_hot.clear()
            first = model.generate(**call, **kw, past_key_values=static(), compile_config=compiled)
            assert hasattr(model, "_compiled_call")  # generate() compiled the decoding steps
            assert any(v._decode_hot for v in cached)  # ... through the decode kernels
            # replayed CUDA graphs: the same run
            again = model.generate(**call, **kw, past_key_values=static(), compile_config=compiled)
            assert torch.equal(again.sequences, first.sequences)
            # Compiled, the model's other kernels round differently in bf16 (which may flip a
            # near-tie): the same scores within 5% while the tokens agree; a wrong position, mask or
            # length would differ by far more.
            agree = agreeing(first, eager)
            assert agree >= 1
            for step in range(agree):
                assert _rel_l2(first.scores[step], eager.scores[step]) < 5e-2, step
