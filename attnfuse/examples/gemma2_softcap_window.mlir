// Gemma 2 local layer: RoPE, query scale 1/sqrt(256), softcap 50, sliding window 4096, GQA.
builtin.module {
  func.func @gemma2(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>) -> tensor<?x8x?x128xbf16> {
    %q_rope = attn.rope %q half theta = 10000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
    %k_rope = attn.rope %k half theta = 10000.0 rotary_dim = 128 : tensor<?x2x?x128xbf16>
    %s = attn.qk %q_rope, %k_rope scale = 0.0625 : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
    %s_1 = attn.softcap %s cap = 50.0 : !attn.scores<8>
    %s_2 = attn.mask %s_1 sliding_window(4096) : !attn.scores<8>
    %p = attn.softmax %s_2 : !attn.scores<8> -> !attn.probs<8>
    %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
    func.return %o : tensor<?x8x?x128xbf16>
  }
}
