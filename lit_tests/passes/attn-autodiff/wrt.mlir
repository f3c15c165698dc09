// wrt picks the gradients, in its order; the ops only other gradients need are dropped.

// RUN: attnfuse-opt %s -p 'attn-autodiff{wrt=2}' | filecheck %s --check-prefix=DV
// RUN: attnfuse-opt %s -p 'attn-autodiff{wrt=1,0}' | filecheck %s --check-prefix=DKDQ
// RUN: attnfuse-opt %s -p 'attn-autodiff{wrt=2},rope-fusion,causal-split,tiling{sm=0}' | filecheck %s --check-prefix=PLACED

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x4x?x32xf16>, %v: tensor<?x4x?x32xf16>) -> tensor<?x4x?x32xf16> {
  %kr = attn.rope %k interleaved theta = 10000.0 rotary_dim = 16 : tensor<?x4x?x32xf16>
  %s = attn.qk %q, %kr scale = 0.5 : tensor<?x4x?x32xf16>, tensor<?x4x?x32xf16> -> !attn.scores<4>
  %t = attn.scale %s value = 2.0 : !attn.scores<4>
  %m = attn.mask %t sliding_window(64) : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// DV:          attributes {attn.wrt = array<i64: 2>}
// DV:            %dp, %dv = attn.pv_grad
// DV-NOT:        attn.softmax_grad
// DV-NOT:        attn.qk_grad
// DV:            func.return %dv

// DKDQ:        attributes {attn.wrt = array<i64: 1, 0>}
// DKDQ:          %dm = attn.softmax_grad
// DKDQ-NEXT:     %ds = attn.scale %dm value = 2.0 : !attn.scores<4>
// DKDQ-NEXT:     %dq, %dkr = attn.qk_grad %ds, %q, %kr scale = 0.5
// DKDQ-NEXT:     %dk = attn.rope_grad %dkr interleaved theta = 10000.0 rotary_dim = 16
// DKDQ-NEXT:     func.return %dk, %dq

// A backward's transforms are placed in pre-rotation kernels; its tiling class is bwd.
// PLACED:      attn.rope_fusion = {q = "none", k = "prerotate"}
// PLACED-SAME: attn.tiling = {{{.*}}class = "bwd"}
// PLACED:        attn.rope %k {{.*}} {placement = #attn.placement<prerotate>}
// PLACED:        attn.mask %t sliding_window(64) attributes {blocks = #attn.kv_bound<sliding_window(64)>}
