// Qwen3: QK-norm (RMSNorm with weights) then RoPE (theta 1e6), causal, GQA.
builtin.module {
  func.func @qwen3(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>, %q_norm_weight: tensor<128xf32>, %k_norm_weight: tensor<128xf32>) -> tensor<?x8x?x128xbf16> {
    %q_norm = attn.norm %q eps = 1.0e-06 weight(%q_norm_weight : tensor<128xf32>) : tensor<?x8x?x128xbf16>
    %q_rope = attn.rope %q_norm half theta = 1000000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
    %k_norm = attn.norm %k eps = 1.0e-06 weight(%k_norm_weight : tensor<128xf32>) : tensor<?x2x?x128xbf16>
    %k_rope = attn.rope %k_norm half theta = 1000000.0 rotary_dim = 128 : tensor<?x2x?x128xbf16>
    %s = attn.qk %q_rope, %k_rope : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
    %s_1 = attn.mask %s causal : !attn.scores<8>
    %p = attn.softmax %s_1 : !attn.scores<8> -> !attn.probs<8>
    %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
    func.return %o : tensor<?x8x?x128xbf16>
  }
}
