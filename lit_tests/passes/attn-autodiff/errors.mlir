// Gradients the compiler cannot form are errors that name the argument and what reads it.

// RUN: not attnfuse-opt %s -p 'attn-autodiff{wrt=3}' 2>&1 | filecheck %s --check-prefix=SLOPES
// RUN: not attnfuse-opt %s -p 'attn-autodiff{wrt=7}' 2>&1 | filecheck %s --check-prefix=RANGE

// A backward function is not differentiated again: a second attn-autodiff is an error.
// RUN: not attnfuse-opt %s -p 'attn-autodiff{wrt=0},attn-autodiff' 2>&1 | filecheck %s --check-prefix=TWICE
// RUN: attnfuse-opt %s -p 'attn-autodiff{wrt=0}' | not attnfuse-opt -p 'attn-autodiff{wrt=0}' 2>&1 | filecheck %s --check-prefix=TWICE

func.func @f(%q: tensor<?x4x?x32xf16>, %k: tensor<?x4x?x32xf16>, %v: tensor<?x4x?x32xf16>, %slopes: tensor<4xf32>) -> tensor<?x4x?x32xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x32xf16>, tensor<?x4x?x32xf16> -> !attn.scores<4>
  %b = attn.bias %s alibi(%slopes : tensor<4xf32>) : !attn.scores<4>
  %p = attn.softmax %b : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x32xf16> -> tensor<?x4x?x32xf16>
  func.return %o : tensor<?x4x?x32xf16>
}

// SLOPES: attnfuse-opt: error: attn-autodiff cannot form the gradient of slopes of @f: it is read by attn.bias alibi, which AttnFuse does not differentiate with respect to it
// RANGE:  attnfuse-opt: error: attn-autodiff wrt index 7 is not an argument of @f
// TWICE-NOT: Traceback
// TWICE:  attnfuse-opt: error: attn-autodiff: func @f_grad is already a backward function (it has attn.wrt): attn-autodiff derives a forward function's backward, once
