// Every stage of the pipeline can be printed on its own; each adds its own attributes
// and leaves the attn ops, until convert-attn-to-tl replaces them with tl ops.

// RUN: attnfuse-opt %s -p 'rope-fusion{seq-len=64}' | filecheck %s --check-prefix=ROPE
// RUN: attnfuse-opt %s -p 'rope-fusion{seq-len=64},causal-split' | filecheck %s --check-prefix=SPLIT
// RUN: attnfuse-opt %s -p 'rope-fusion{seq-len=64},causal-split,tiling{sm=0}' | filecheck %s --check-prefix=TILING
// RUN: attnfuse-opt %s -p 'rope-fusion{seq-len=64},causal-split,tiling{sm=0},convert-attn-to-tl' | filecheck %s --check-prefix=TL

// The named pipeline is exactly those four stages with its options passed on.
// RUN: attnfuse-opt %s -p 'rope-fusion{seq-len=64 sm=0},causal-split,tiling{sm=0},convert-attn-to-tl' > %t.stages
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 seq-len=64}' > %t.pipeline
// RUN: diff %t.stages %t.pipeline

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>) -> tensor<?x4x?x32xf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 32 : tensor<?x4x?x32xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 32 : tensor<?x2x?x32xf16>
  %s = attn.qk %qr, %kr : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// ROPE:          func.func @f({{.*}}) -> tensor<?x4x?x32xf16> attributes {attn.rope_fusion = {k = "kv_loop", {{.*}}}} {
// ROPE-NEXT:       %qr = attn.rope %q {{.*}} {placement = #attn.placement<q_prologue>}
// ROPE-NEXT:       %kr = attn.rope %k {{.*}} {placement = #attn.placement<kv_loop>}
// ROPE-NEXT:       %s = attn.qk %qr, %kr {score_scale = {{.*}}}
// ROPE-NEXT:       %m = attn.mask %s causal : !attn.scores<4>
// ROPE-NOT:      attn.kv_blocks
// ROPE-NOT:      attn.tiling

// SPLIT:         attributes {attn.rope_fusion = {k = "kv_loop", {{.*}}}, attn.kv_blocks = [#attn.kv_bound<causal>]} {
// SPLIT:           %m = attn.mask %s causal attributes {blocks = #attn.kv_bound<causal>} : !attn.scores<4>
// SPLIT-NOT:     attn.tiling

// TILING:        attributes {attn.rope_fusion = {k = "kv_loop", {{.*}}}, attn.kv_blocks = [#attn.kv_bound<causal>], attn.tiling = {block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, class = "kloop"}} {
// TILING:          %o = attn.pv %p, %v
// TILING-NEXT:     func.return %o

// TL:            builtin.module {
// TL-NEXT:         tl.kernel @attn_fwd(
// TL:              tl.launcher "launch"(["q", "k", "v"]) {
// TL-NOT:          attn.
