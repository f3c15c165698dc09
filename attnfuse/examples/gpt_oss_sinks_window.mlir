// gpt-oss: YaRN RoPE, sliding window 128, causal, per-head attention sinks.
builtin.module {
  func.func @gpt_oss(%q: tensor<?x8x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>, %sinks: tensor<8xf32>) -> tensor<?x8x?x64xbf16> {
    %q_rope = attn.rope %q half theta = 150000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 32.0, original_max_position = 4096.0, beta_fast = 32.0, beta_slow = 1.0, truncate = false> : tensor<?x8x?x64xbf16>
    %k_rope = attn.rope %k half theta = 150000.0 rotary_dim = 64 scaling = #attn.rope_scaling<yarn, factor = 32.0, original_max_position = 4096.0, beta_fast = 32.0, beta_slow = 1.0, truncate = false> : tensor<?x2x?x64xbf16>
    %s = attn.qk %q_rope, %k_rope : tensor<?x8x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<8>
    %s_1 = attn.mask %s sliding_window(128) : !attn.scores<8>
    %p = attn.softmax %s_1 sink(%sinks : tensor<8xf32>) : !attn.scores<8> -> !attn.probs<8>
    %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x64xbf16> -> tensor<?x8x?x64xbf16>
    func.return %o : tensor<?x8x?x64xbf16>
  }
}
