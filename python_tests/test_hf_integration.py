"""Hugging Face transformers models under `attnfuse.integrations.transformers.apply` (issue 12, items 2-3).

Tiny random models of each family (2 layers, hidden 64, 4 query / 2 kv heads of dim 16, vocab 64,
at most 16 tokens), fp32, the generated kernels run by the Triton interpreter (`interpret`
backend), each against the same model with transformers' eager attention (the weights copied):

- logits within 1e-4 relative L2;
- the gradient of every parameter (of the causal-LM loss of random labels) within 1e-3, Qwen3's
  q_norm/k_norm weights and gpt-oss's sinks included;
- a left-padded batch (with the position_ids `generate()` would make) on its real tokens;
- greedy `generate()` with the KV cache, dynamic and static: the same tokens; decoding steps
  against a static cache under torch.compile(fullgraph=True);
- packed sequences (positions restarting, no mask) for Llama, and positions that restart or jump
  under an all-ones mask or with a cache, which transformers does not pack;
- one position_ids tensor refilled in place between calls;
- torch.compile(fullgraph=True) of a one-layer patched Llama, forward and backward;
- a shared config left alone by `apply`, output_attentions refused, a pickled patched model;
- unsupported models, configs and caches (a static cache's sliding-window layers) raise
  `AttnFuseError`, and a failed `apply` leaves the model as it was.

The configs set windows (5) shorter than the sequences, Gemma 2's softcap and query_pre_attn_scalar
to values that matter, llama3 and YaRN rope scaling to contexts where they change frequencies, and
random norm weights and sinks.
"""

from __future__ import annotations

import copy
import inspect
import pickle
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402

import attnfuse as af  # noqa: E402
from attnfuse.integrations.transformers import ATTN_IMPLEMENTATION, PatchedAttention, apply  # noqa: E402
from attnfuse.rope_freqs import inv_freq  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

LOGITS_TOLERANCE = 1e-4
GRAD_TOLERANCE = 1e-3
VOCAB = 64
N = 12
NEW_TOKENS = 4

TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.1,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def _llama() -> object:
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return transformers.LlamaConfig(**TINY, rope_parameters=rope)


def _mistral() -> object:
    return transformers.MistralConfig(**TINY, sliding_window=5)


def _qwen2() -> object:
    return transformers.Qwen2Config(**TINY, use_sliding_window=True, sliding_window=5, max_window_layers=1)


def _qwen3() -> object:
    return transformers.Qwen3Config(**TINY, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})


def _gemma2() -> object:
    return transformers.Gemma2Config(
        **TINY, sliding_window=5, query_pre_attn_scalar=24, attn_logit_softcapping=1.0, final_logit_softcapping=30.0
    )


def _gpt_oss() -> object:
    tiny = {**TINY, "max_position_embeddings": 4096}
    rope = {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 128,
    }
    return transformers.GptOssConfig(
        **tiny, sliding_window=5, num_local_experts=4, num_experts_per_tok=2, rope_parameters=rope
    )


CONFIGS: dict[str, tuple[str, Callable[[], object]]] = {
    "llama": ("LlamaForCausalLM", _llama),
    "mistral": ("MistralForCausalLM", _mistral),
    "qwen2": ("Qwen2ForCausalLM", _qwen2),
    "qwen3": ("Qwen3ForCausalLM", _qwen3),
    "gemma2": ("Gemma2ForCausalLM", _gemma2),
    "gpt_oss": ("GptOssForCausalLM", _gpt_oss),
}
FAMILIES = [name for name, (cls, _) in CONFIGS.items() if hasattr(transformers, cls)]


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    """A private kernel cache folder for this module's interpreted kernels, and the interpreter."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("hf-cache")))
        with af.backend("interpret"):
            yield


def _randomise(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Norm weights and sinks away from their initial ones and zeros (torch.empty for sinks)."""
    for name, p in model.named_parameters():
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            p.data = 1.0 + 0.5 * torch.randn(p.shape, generator=gen)
        elif name.endswith("sinks"):
            p.data = torch.randn(p.shape, generator=gen)


@pytest.fixture(scope="module", params=FAMILIES)
def models(request) -> tuple[str, torch.nn.Module, torch.nn.Module]:
    """(family, the eager model, a copy patched by `apply`), fp32, eval mode."""
    family = request.param
    cls_name, make_config = CONFIGS[family]
    torch.manual_seed(0)
    eager = getattr(transformers, cls_name)(make_config()).float().eval()
    _randomise(eager, torch.Generator().manual_seed(1))
    eager.set_attn_implementation("eager")
    patched = apply(copy.deepcopy(eager))
    return family, eager, patched


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    return ((x - ref).norm() / ref.norm()).item()


def _ids(b: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (b, n), generator=torch.Generator().manual_seed(seed))


def _left_padded() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [3, N] with 0, 3 and 7 padding tokens first, the mask, and generate()'s position_ids."""
    ids = _ids(3, N, seed=2)
    mask = torch.ones(3, N, dtype=torch.long)
    for row, pad in enumerate((0, 3, 7)):
        mask[row, :pad] = 0
        ids[row, :pad] = 0
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


# --------------------------------------------------------------------------- per family


def test_patched(models):
    family, eager, patched = models
    assert patched.config._attn_implementation == ATTN_IMPLEMENTATION
    assert eager.config._attn_implementation == "eager"
    specs = [m._attnfuse_spec for m in patched.modules() if hasattr(m, "_attnfuse_spec")]
    assert len(specs) == 2
    windows = {"llama": [None, None], "mistral": [5, 5], "qwen2": [None, 5], "qwen3": [None, None]}
    assert [s.window for s in specs] == windows.get(family, [5, None])  # gemma2, gpt_oss: sliding, full


def test_logits(models):
    family, eager, patched = models
    ids = _ids(2, N)
    with torch.no_grad():
        want = eager(ids, use_cache=False).logits
        assert rel_l2(patched(ids, use_cache=False).logits, want) < LOGITS_TOLERANCE
        assert rel_l2(patched(ids).logits, want) < LOGITS_TOLERANCE  # a fresh cache: written with rotated keys


def _loss(model: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """transformers' own causal-LM loss, as a training step computes it (with the model's default
    use_cache: the patched model also writes rotated keys to a cache nobody reads)."""
    return model(ids, labels=targets).loss


def test_gradients(models):
    family, eager, patched = models
    ids, targets = _ids(2, N, seed=3), _ids(2, N, seed=4)
    eager.train(), patched.train()
    try:
        for model in (eager, patched):
            model.zero_grad()
            _loss(model, ids, targets).backward()
    finally:
        eager.eval(), patched.eval()
    got = dict(patched.named_parameters())
    checked = []
    for name, p in eager.named_parameters():
        if p.grad is None:
            continue
        grad = got[name].grad
        assert grad is not None, name
        assert rel_l2(grad, p.grad) < GRAD_TOLERANCE, name
        checked.append(name)
    special = {"qwen3": "self_attn.k_norm.weight", "gpt_oss": "self_attn.sinks"}.get(family)
    assert special is None or any(n.endswith(special) for n in checked)
    assert any(n.endswith("q_proj.weight") for n in checked)


def test_left_padded(models):
    family, eager, patched = models
    ids, mask, positions = _left_padded()
    real = mask.bool()
    with torch.no_grad():
        want = eager(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        got = patched(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
    assert rel_l2(got[real], want[real]) < LOGITS_TOLERANCE


def test_generate(models):
    """Greedy decoding of a left-padded batch: the same tokens, and the same scores at every step
    (decode runs the variant whose keys come rotated from the cache)."""
    family, eager, patched = models
    ids, mask, _ = _left_padded()
    kwargs = dict(
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    want = eager.generate(ids, **kwargs)
    got = patched.generate(ids, **kwargs)
    assert want.sequences.shape == (3, N + NEW_TOKENS)
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.scores, want.scores, strict=True)):
        assert rel_l2(a, b) < LOGITS_TOLERANCE, step


def test_generate_unpadded(models):
    """Without padding, the cached steps run the decode kernels (Variant.decode): same tokens."""
    family, eager, patched = models
    ids = _ids(1, 7, seed=5)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    cached = [v for (is_cached, mask), v in _layer_variants(patched).items() if is_cached and mask == "causal"]
    for v in cached:
        v._decode_hot.clear()
    assert torch.equal(patched.generate(ids, **kwargs), eager.generate(ids, **kwargs))
    assert cached and all(v._decode_hot for v in cached)


def _has_sliding_layers(model: torch.nn.Module) -> bool:
    cache = transformers.StaticCache(config=model.config, max_cache_len=8)
    return any(layer.is_sliding for layer in cache.layers)


def test_generate_static_cache(models):
    """cache_implementation="static": greedy decoding, unpadded and left-padded, gives the eager
    model's tokens and scores, the cached steps through the decode kernels (the cache's length
    read on the device). A model with sliding-window layers, whose static layers are rolling
    buffers, is refused before any layer writes its cache."""
    family, eager, patched = models
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, cache_implementation="static")
    kwargs |= dict(output_scores=True, return_dict_in_generate=True)
    if _has_sliding_layers(eager):
        with pytest.raises(af.AttnFuseError, match="sliding-window layers.*StaticSlidingWindowLayer"):
            patched.generate(_ids(1, 7, seed=5), **kwargs)
        return
    cached = [v for (is_cached, _), v in _layer_variants(patched).items() if is_cached]
    for v in cached:
        v._decode_hot.clear()
    ids, mask, _ = _left_padded()
    for call in (dict(inputs=_ids(1, 7, seed=5)), dict(inputs=ids, attention_mask=mask)):
        want = eager.generate(**call, **kwargs)
        got = patched.generate(**call, **kwargs)
        assert torch.equal(got.sequences, want.sequences)
        for step, (a, b) in enumerate(zip(got.scores, want.scores, strict=True)):
            assert rel_l2(a, b) < LOGITS_TOLERANCE, step
    assert {mask for (is_cached, mask), v in _layer_variants(patched).items() if is_cached and v._decode_hot} == {
        "causal",
        "padded",
    }


def _layer_variants(model: torch.nn.Module) -> dict:
    """The AttnFuse variants of the patched model's first attention layer, by (cached, mask kind)."""
    patched = next(m.forward for m in model.modules() if isinstance(getattr(m, "forward", None), PatchedAttention))
    return patched.variants


# --------------------------------------------------------------------------- Llama only


@pytest.fixture(scope="module")
def llama() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(_llama()).eval()
    eager.set_attn_implementation("eager")
    return eager, apply(copy.deepcopy(eager))


def test_packed_sequences(llama):
    """Positions restarting at 0 without a mask: documents packed in one row attend within
    themselves, through Variant.varlen (each document a sequence), gradients included."""
    eager, patched = llama
    ids = _ids(2, N, seed=6)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6], list(range(N))])
    varlen = _layer_variants(patched)[False, "varlen"]
    calls = []
    original = varlen.varlen
    varlen.varlen = lambda *a, **kw: calls.append(a[3].tolist()) or original(*a, **kw)  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            want = eager(ids, position_ids=positions, use_cache=False).logits
            got = patched(ids, position_ids=positions, use_cache=False).logits
        assert rel_l2(got, want) < LOGITS_TOLERANCE
        assert calls and calls[0] == [0, 5, 12, 24]  # three documents: 5, 7 and 12 tokens
        loss = patched(ids, position_ids=positions, labels=ids, use_cache=False).loss
        loss.backward()
        ref = eager(ids, position_ids=positions, labels=ids, use_cache=False).loss
        ref.backward()
        for (name, p), (_, r) in zip(patched.named_parameters(), eager.named_parameters(), strict=True):
            if "self_attn" in name and p.grad is not None:
                assert rel_l2(p.grad, r.grad) < LOGITS_TOLERANCE, name
    finally:
        del varlen.varlen
        patched.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)


def test_dropout_in_training_refused(llama):
    _, patched = llama
    model = copy.deepcopy(patched)
    for m in model.modules():
        if hasattr(m, "_attnfuse_spec"):
            m.attention_dropout = 0.1
    model.eval()(_ids(1, 4))  # no dropout in eval mode
    with pytest.raises(af.AttnFuseError, match="attention dropout in training"):
        model.train()(_ids(1, 4))


# --------------------------------------------------------------------------- unsupported


def _refused(model: torch.nn.Module, match: str) -> None:
    before = model.config._attn_implementation
    with pytest.raises(af.AttnFuseError, match=match):
        apply(model)
    assert model.config._attn_implementation == before
    assert not any(hasattr(m, "_attnfuse_spec") for m in model.modules())


def test_unsupported_architecture():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=32)
    _refused(transformers.GPT2LMHeadModel(config), "model type 'gpt2'")


@pytest.mark.parametrize(
    ("rope", "match"),
    [
        ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, "rope type 'dynamic'"),
        ({"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}, "partial rotary"),
        ({"rope_type": "yarn", "rope_theta": 10000.0}, "rope_type 'yarn' needs 'original_max_position_embeddings'"),
        (
            {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0},
            "rope_type 'yarn' needs 'original_max_position_embeddings'",
        ),
        ({"rope_type": "linear", "rope_theta": 10000.0}, "rope_type 'linear' needs 'factor'"),
    ],
    ids=["dynamic-rope", "partial-rotary", "yarn-no-original", "yarn-factor-no-original", "linear-no-factor"],
)
def test_unsupported_rope(rope, match):
    config = transformers.LlamaConfig(**{**TINY, "num_hidden_layers": 1})
    model = transformers.LlamaForCausalLM(config)
    model.config.rope_parameters = rope
    _refused(model, match)


@pytest.mark.parametrize(
    ("scaling", "params", "match"),
    [("yarn", {"factor": 4.0}, "'original_max_position'"), ("llama3", {}, "'factor'"), ("ntk", {"factor": 2.0}, "ntk")],
)
def test_rope_freqs_missing_parameter(scaling, params, match):
    """The frequencies' own reader names a missing parameter (no bare KeyError)."""
    with pytest.raises(af.AttnFuseError, match=match):
        inv_freq(10000.0, 16, scaling, **params)


def test_bidirectional_refused():
    if "gemma2" not in FAMILIES:
        pytest.skip("no Gemma 2 in this transformers")
    config = transformers.Gemma2Config(**{**TINY, "num_hidden_layers": 1})
    model = transformers.Gemma2ForCausalLM(config)
    model.config.use_bidirectional_attention = True
    _refused(model, "bidirectional")


def test_core_import_is_free_of_transformers():
    code = "import sys, attnfuse, attnfuse.variants, attnfuse.integrations; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_torch_compile_fullgraph():
    """A patched (one-layer) Llama under torch.compile(fullgraph=True), forward and backward: no
    graph break, its logits and a projection's gradient those of the eager model. The "aot_eager"
    backend, as the other CPU compile tests: it traces what inductor would (dynamo, then AOTAutograd
    with the attnfuse ops' fake kernels and backward) without compiling the model's C++."""
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY, "num_hidden_layers": 1})).eval()
    eager.set_attn_implementation("eager")
    model = apply(copy.deepcopy(eager))
    ids = _ids(1, 8, seed=7)
    step = torch.compile(lambda x: model(x, use_cache=False).logits, fullgraph=True, backend="aot_eager")
    want = eager(ids, use_cache=False).logits
    got = step(ids)
    assert rel_l2(got, want) < LOGITS_TOLERANCE
    want.square().mean().backward()
    got.square().mean().backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None
    assert rel_l2(grad, eager.model.layers[0].self_attn.q_proj.weight.grad) < GRAD_TOLERANCE


def test_static_cache_compiled_decode_steps(llama):
    """Decoding steps against a static cache under torch.compile(fullgraph=True), as generate()
    compiles them: no graph break (the decode kernels one attnfuse::decode node, the cache's length
    a device tensor), the eager model's logits at every step; a longer call under compile is
    refused with the reason."""
    eager, patched = llama
    ids = _ids(2, 9, seed=8)

    cache_arg = "cache" if "cache" in inspect.signature(eager.forward).parameters else "past_key_values"

    def step(model, tokens, cache, positions):
        return model(tokens, **{cache_arg: cache}, position_ids=positions, use_cache=True).logits[:, -1]

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    runs = []
    for model, call in ((eager, step), (patched, compiled)):
        cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        with torch.no_grad():
            logits = [model(ids, **{cache_arg: cache}, use_cache=True).logits[:, -1]]  # prefill, uncompiled
            for i in range(3):
                tokens = logits[-1].argmax(-1, keepdim=True)
                logits.append(call(model, tokens, cache, torch.full((2, 1), 9 + i)))
        runs.append(logits)
    for i, (got, want) in enumerate(zip(runs[1], runs[0], strict=True)):
        assert rel_l2(got, want) < LOGITS_TOLERANCE, i
    cache = transformers.StaticCache(config=patched.config, max_cache_len=40)
    with torch.no_grad(), pytest.raises(Exception, match="at most 16 tokens"):
        compiled(patched, _ids(2, 20, seed=9), cache, torch.arange(20).expand(2, 20))


# --------------------------------------------------------------------------- model state and call arguments


def test_apply_leaves_a_shared_config_alone():
    """Two models built from one config object share it in transformers; patching one leaves the
    other on its own attention, with its own logits."""
    config = transformers.LlamaConfig(**{**TINY, "num_hidden_layers": 1})
    reference, patched = [transformers.LlamaForCausalLM(config).eval() for _ in range(2)]
    patched.load_state_dict(reference.state_dict())
    assert patched.config is reference.config
    implementation = reference.config._attn_implementation
    ids = _ids(1, 8, seed=9)
    with torch.no_grad():
        want = reference(ids, use_cache=False).logits
        apply(patched)
        assert reference.config._attn_implementation == implementation != ATTN_IMPLEMENTATION
        assert patched.config is not config
        assert patched.model.config is patched.config and patched.model.layers[0].self_attn.config is patched.config
        assert torch.equal(reference(ids, use_cache=False).logits, want)
        assert rel_l2(patched(ids, use_cache=False).logits, want) < LOGITS_TOLERANCE


def test_output_attentions_refused(llama):
    """Attention weights asked for, in the call or by the config (set while the model was eager):
    an error, not an empty tuple."""
    eager, patched = llama
    model = copy.deepcopy(patched)  # output_attentions hooks the model with what pickle refuses
    with pytest.raises(af.AttnFuseError, match="does not materialise attention weights"):
        model(_ids(1, 4), output_attentions=True)
    model = copy.deepcopy(eager)
    model.config.output_attentions = True
    apply(model)
    with pytest.raises(af.AttnFuseError, match="config.output_attentions"):
        model(_ids(1, 4))
    model(_ids(1, 4), output_attentions=False)  # the call's choice wins, as in transformers


def test_positions_refilled_in_place(llama):
    """One position_ids tensor refilled in place between calls (as a generation loop reuses its
    buffers): every call sees its values, as with a fresh tensor and as the eager model."""
    eager, patched = llama
    ids = _ids(2, N, seed=8)
    steps = [
        list(range(N)),
        [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6],
        [0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5],
        list(range(5, 17)),
    ]
    positions = torch.zeros(1, N, dtype=torch.long)
    with torch.no_grad():
        for step in steps:
            positions.copy_(torch.tensor([step]))
            got = patched(ids, position_ids=positions, use_cache=False).logits
            fresh = patched(ids, position_ids=positions.clone(), use_cache=False).logits
            want = eager(ids, position_ids=positions.clone(), use_cache=False).logits
            assert torch.equal(got, fresh), step
            assert rel_l2(got, want) < LOGITS_TOLERANCE, step


def test_restarting_positions_not_packed_with_a_mask_or_cache(llama):
    """Positions that restart or jump are packed documents only without a mask and without a
    cache, as transformers decides: an all-ones 2-D mask or a cache keeps plain causal attention,
    as in transformers' eager and SDPA paths."""
    eager, patched = llama
    ids = _ids(2, N, seed=10)
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 9, 10, 11, 12, 13, 14, 15, 16]])
    ones = torch.ones(2, N, dtype=torch.long)
    with torch.no_grad():
        packed = eager(ids, position_ids=positions, use_cache=False).logits
        assert rel_l2(patched(ids, position_ids=positions, use_cache=False).logits, packed) < LOGITS_TOLERANCE
        for implementation in ("eager", "sdpa"):
            reference = copy.deepcopy(eager)
            reference.set_attn_implementation(implementation)
            want = reference(ids, attention_mask=ones, position_ids=positions, use_cache=False).logits
            assert rel_l2(want, packed) > 0.01  # the two readings differ here
            got = patched(ids, attention_mask=ones, position_ids=positions, use_cache=False).logits
            assert rel_l2(got, want) < LOGITS_TOLERANCE, implementation
            want = reference(ids, position_ids=positions).logits  # a fresh cache, no mask
            assert rel_l2(patched(ids, position_ids=positions).logits, want) < LOGITS_TOLERANCE, implementation


_UNPICKLE = """
import pickle, sys, torch
import attnfuse as af
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
with open(sys.argv[1], "rb") as f:
    model, ids, mask, positions, want = pickle.load(f)
assert "attnfuse" in ALL_MASK_ATTENTION_FUNCTIONS
with torch.no_grad(), af.backend("reference"):
    got = model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
real = mask.bool()
print(((got[real] - want[real]).norm() / want[real].norm()).item())
"""


def test_pickled_model_runs(llama, tmp_path):
    """A patched model pickles; loaded here, and in a fresh process (where unpickling registers the
    attention implementation), it runs as the original: a left-padded batch's logits."""
    _, patched = llama
    ids, mask, positions = _left_padded()
    with torch.no_grad():
        want = patched(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        model = pickle.loads(pickle.dumps(patched))
        attention = model.model.layers[1].self_attn
        assert isinstance(attention.forward, PatchedAttention) and attention.forward.module is attention
        assert torch.equal(model(ids, attention_mask=mask, position_ids=positions, use_cache=False).logits, want)
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps((patched, ids, mask, positions, want)))
    out = subprocess.run([sys.executable, "-c", _UNPICKLE, str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) < LOGITS_TOLERANCE


def test_other_caches_and_continuous_batching_refused(llama):
    """A cache that is neither dynamic nor static (a legacy tuple, a paged cache) is an
    `AttnFuseError` naming it; transformers' continuous batching (generate_batch), which accepts
    only its own list of attention implementations, refuses a patched model up front."""
    _, patched = llama

    class PagedAttentionCache:  # the name of transformers' continuous-batching cache
        pass

    attention = patched.model.layers[0].self_attn
    hidden = torch.randn(1, 4, TINY["hidden_size"])
    for cache, match in ((((None, None),), "got tuple"), (PagedAttentionCache(), "continuous batching")):
        with torch.no_grad(), pytest.raises(af.AttnFuseError, match=match):
            attention(hidden, cache=cache)
    config = transformers.GenerationConfig(max_new_tokens=2, do_sample=False, eos_token_id=-1, pad_token_id=0)
    with pytest.raises((ValueError, af.AttnFuseError), match="attnfuse"):
        patched.generate_batch([[5, 6, 7], [8, 9]], generation_config=config)


def test_rotate_is_the_half_style_rope(llama):
    """The keys a cache holds: x1 cos - x2 sin, x2 cos + x1 sin at each position, with the
    kernels' frequencies, for shared [N] and per-row [B, N] positions."""
    from attnfuse.integrations.hf_rope import _frequencies
    from attnfuse.integrations.transformers import layer_spec, rotate

    _, patched = llama
    spec = layer_spec(patched.config, patched.model.layers[0].self_attn, 0)
    x = torch.randn(2, 2, 7, spec.head_dim, generator=torch.Generator().manual_seed(3))
    freqs, magnitude = _frequencies(spec, x.device)
    half = spec.head_dim // 2
    for positions in (torch.arange(3, 10), torch.stack([torch.arange(7), torch.arange(20, 27)])):
        angle = positions.float()[..., None] * freqs
        cos, sin = angle.cos() * magnitude, angle.sin() * magnitude
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]
        x1, x2 = x[..., :half], x[..., half:]
        want = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
        torch.testing.assert_close(rotate(spec, x, positions), want, rtol=1e-6, atol=1e-6)
