// The variant class follows rope-fusion's decision: K rotated in the KV loop is
// `kloop`; pre-rotated K (or no rope-fusion run, so no placement yet) is `plain`.

// RUN: attnfuse-opt %s -p 'rope-fusion{mode=fused},tiling{sm=90}' | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s -p 'rope-fusion{mode=prerotate},tiling{sm=90}' | filecheck %s --check-prefix=PREROTATE
// RUN: attnfuse-opt %s -p 'tiling{sm=90}' | filecheck %s --check-prefix=NOFUSION
// sm80 has no kloop entry: the plain one is used, class still kloop.
// RUN: attnfuse-opt %s -p 'rope-fusion{mode=fused},tiling{sm=80}' | filecheck %s --check-prefix=SM80

func.func @rope(%q: tensor<?x4x?x64xf16>, %k: tensor<?x2x?x64xf16>, %v: tensor<?x2x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 64 : tensor<?x2x?x64xf16>
  %s = attn.qk %q, %kr : tensor<?x4x?x64xf16>, tensor<?x2x?x64xf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// FUSED:     class = "kloop"
// PREROTATE: class = "plain"
// NOFUSION:  class = "plain"
// SM80:      attn.tiling = {block_m = 128 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64, class = "kloop"}
