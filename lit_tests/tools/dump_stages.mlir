// --dump-stages DIR writes the IR before and after each pass, attnfuse-pipeline
// expanded into the stages of its table (attnfuse.pipeline.STAGES), as
// NN-<stage>.mlir; each file reads back.

// RUN: rm -rf %t && attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 seq-len=64}' --dump-stages %t > %t.out
// RUN: ls %t | filecheck %s --check-prefix=FILES
// FILES:      00-input.mlir
// FILES-NEXT: 01-kernel-path.mlir
// FILES-NEXT: 02-rope-fusion.mlir
// FILES-NEXT: 03-causal-split.mlir
// FILES-NEXT: 04-tiling.mlir
// FILES-NEXT: 05-convert-attn-to-tl.mlir
// FILES-EMPTY:

// The last stage reads back as the tool's output; an earlier one carries its stage's work.
// RUN: attnfuse-opt %t/05-convert-attn-to-tl.mlir > %t.again
// RUN: diff %t.again %t.out
// RUN: attnfuse-opt %t/04-tiling.mlir | filecheck %s --check-prefix=TILING
// TILING: attn.tiling = {block_m = {{[0-9]+}} : i64
// TILING: attn.mask %s causal

// A skipped stage writes no file: NN counts the files written.
// RUN: rm -rf %t && attnfuse-opt %s -p 'attnfuse-pipeline{sm=0 causal-split=false}' --dump-stages %t > /dev/null
// RUN: ls %t | filecheck %s --check-prefix=SKIPPED
// SKIPPED:      00-input.mlir
// SKIPPED-NEXT: 01-kernel-path.mlir
// SKIPPED-NEXT: 02-rope-fusion.mlir
// SKIPPED-NEXT: 03-tiling.mlir
// SKIPPED-NEXT: 04-convert-attn-to-tl.mlir
// SKIPPED-EMPTY:

// Other passes are one stage each, named by the pass.
// RUN: rm -rf %t && attnfuse-opt %s -p 'rope-fusion,tiling{sm=0}' --dump-stages %t > /dev/null
// RUN: ls %t | filecheck %s --check-prefix=PASSES
// PASSES:      00-input.mlir
// PASSES-NEXT: 01-rope-fusion.mlir
// PASSES-NEXT: 02-tiling.mlir
// PASSES-EMPTY:

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x2x?x32xf16>, %v: tensor<?x2x?x32xf16>) -> tensor<?x4x?x32xf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 32 : tensor<?x4x?x32xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 32 : tensor<?x2x?x32xf16>
  %s = attn.qk %qr, %kr : tensor<?x4x?x32xf16>, tensor<?x2x?x32xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}
