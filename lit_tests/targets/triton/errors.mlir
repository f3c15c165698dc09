// The triton target prints tl ops only: anything else is an error naming the op and
// what to run first, never half-printed Python.

// RUN: not attnfuse-opt %s -t triton 2>&1 | filecheck %s
// A module whose lowering stopped before convert-attn-to-tl.
// RUN: not attnfuse-opt %s -p 'rope-fusion,causal-split,tiling' -t triton 2>&1 | filecheck %s

// CHECK-NOT:   Traceback
// CHECK-NOT:   @triton.jit
// CHECK:       attnfuse-opt: error: the triton target prints only tl ops, found 'func.func': lower the module with the attnfuse-pipeline (or convert-attn-to-tl) first
// CHECK-NOT:   Traceback

func.func @f(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %p = attn.softmax %s : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}
