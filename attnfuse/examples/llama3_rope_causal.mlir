// Llama-3 style attention: RoPE (theta 500000, llama3 scaling) on q and k, causal mask, GQA 32/8.
func.func @llama3(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = 128 scaling = #attn.rope_scaling<llama3, factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192.0> : tensor<?x32x?x128xbf16>
  %kr = attn.rope %k half theta = 500000.0 rotary_dim = 128 scaling = #attn.rope_scaling<llama3, factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192.0> : tensor<?x8x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<32>
  %m = attn.mask %s causal : !attn.scores<32>
  %p = attn.softmax %m : !attn.scores<32> -> !attn.probs<32>
  %o = attn.pv %p, %v : !attn.probs<32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}
