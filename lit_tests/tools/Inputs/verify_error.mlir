func.func @f(%q: tensor<?x8x?x64xf32>, %k: tensor<?x3x?x64xf32>) {
  %s = attn.qk %q, %k : tensor<?x8x?x64xf32>, tensor<?x3x?x64xf32> -> !attn.scores<8>
  func.return
}
