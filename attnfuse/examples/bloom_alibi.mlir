// BLOOM: ALiBi bias from a slopes tensor, causal.
builtin.module {
  func.func @bloom(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>, %slopes: tensor<8xf32>) -> tensor<?x8x?x128xbf16> {
    %s = attn.qk %q, %k : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
    %s_1 = attn.bias %s alibi(%slopes : tensor<8xf32>) : !attn.scores<8>
    %s_2 = attn.mask %s_1 causal : !attn.scores<8>
    %p = attn.softmax %s_2 : !attn.scores<8> -> !attn.probs<8>
    %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
    func.return %o : tensor<?x8x?x128xbf16>
  }
}
