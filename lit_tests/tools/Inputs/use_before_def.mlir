// %p is used on line 4 and defined on line 5.
func.func @f(%q: tensor<?x4x?x16xf32>, %k: tensor<?x4x?x16xf32>, %v: tensor<?x4x?x16xf32>) -> tensor<?x4x?x16xf32> {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x4x?x16xf32> -> !attn.scores<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x16xf32> -> tensor<?x4x?x16xf32>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  func.return %o : tensor<?x4x?x16xf32>
}
