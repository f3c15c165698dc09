// causal-split=false skips the causal-split stage (the ablation's baseline): the causal
// mask is left unclassified, so the kernel runs one loop over every KV block up to Nk,
// each masked, instead of a full segment and a masked diagonal segment.

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 causal-split=false}' | filecheck %s
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0}' | filecheck %s --check-prefix=SPLIT
// RUN: not attnfuse-opt %s -p 'attnfuse-pipeline{causal-split=maybe}' 2>&1 | filecheck %s --check-prefix=BAD

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>) -> tensor<?x4x?x32xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// CHECK:         tl.kernel @attn_fwd(
// CHECK:           tl.for %start_n = %{{.*}} to %NK step %BLOCK_N
// CHECK:             %causal = tl.cmp "<="
// CHECK-NOT:       tl.for

// SPLIT:         tl.kernel @attn_fwd(
// SPLIT:           tl.for %start_n = %{{.*}} to %full_hi step %BLOCK_N
// SPLIT-NOT:         %causal
// SPLIT:           tl.for %start_n_1 = %full_hi to %kv_hi step %BLOCK_N
// SPLIT:             %causal = tl.cmp "<="

// BAD:           attnfuse-opt: error: {{.*}}Incompatible types: given ('maybe',), expected <class 'bool'>
