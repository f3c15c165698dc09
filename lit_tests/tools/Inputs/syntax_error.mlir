func.func @f(%q: tensor<?x8x?x64xf32>) {
  %r = attn.rope %q half theta 10000.0 rotary_dim = 64 : tensor<?x8x?x64xf32>
  func.return
}
