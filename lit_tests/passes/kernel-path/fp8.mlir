// The FP8 form (attn.hadamard, attn.quantize) has no kernel lowering yet: kernel-path refuses it
// with one diagnostic naming the op, and attn-autodiff refuses its backward (the form is
// forward-only); the reference executor runs it.

// RUN: not attnfuse-opt %s -p 'kernel-path{sm=90}' 2>&1 | filecheck %s --check-prefix=PATH
// PATH-NOT: Traceback
// PATH:     attnfuse-opt: error: @fp8: attn.hadamard (the FP8 form) has no kernel lowering yet; run the variant with af.backend('reference')

// RUN: not attnfuse-opt %s -p 'attn-autodiff' 2>&1 | filecheck %s --check-prefix=GRAD
// GRAD-NOT: Traceback
// GRAD:     attnfuse-opt: error: attn-autodiff: @fp8 is in the FP8 form (attn.hadamard), which is forward-only (inference): it has no backward

func.func @fp8(%q: tensor<?x8x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>) -> tensor<?x8x?x64xbf16> {
  %qh = attn.hadamard %q seed = 1 : tensor<?x8x?x64xbf16>
  %q8 = attn.quantize %qh e4m3 block = 64 : tensor<?x8x?x64xbf16>
  %kh = attn.hadamard %k seed = 1 : tensor<?x2x?x64xbf16>
  %k8 = attn.quantize %kh e4m3 block = 64 : tensor<?x2x?x64xbf16>
  %s = attn.qk %q8, %k8 : tensor<?x8x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<8>
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x64xbf16> -> tensor<?x8x?x64xbf16>
  func.return %o : tensor<?x8x?x64xbf16>
}
