// The FP8 form (q and k end in attn.quantize) takes the `fp8` path: e4m3 products where the GPU
// has FP8 tensor cores (sm 89 and up), the same e4m3 values multiplied in fp32 elsewhere (the
// interpreter); on sm 90 the Gluon kernel where it takes the variant (v quantized, scale blocks
// that tile its 64-row and 128-key blocks, a causal mask or none), from min-len. rope-fusion
// then places every transform of a quantized operand in its quantization kernel. What the path
// does not take is one diagnostic naming it; attn-autodiff refuses the form's backward.

// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90},rope-fusion' | filecheck %s --check-prefix=SM90
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=0}' | filecheck %s --check-prefix=INTERP
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=80}' | filecheck %s --check-prefix=INTERP
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 gluon=false min-len=4096}' | filecheck %s --check-prefix=NOGLUON
// RUN: not attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 decode=true}' 2>&1 | filecheck %s --check-prefix=DECODE
// RUN: not attnfuse-opt %s --split-input-file -p 'attn-autodiff' 2>&1 | filecheck %s --check-prefix=GRAD

// SM90:      func.func @fp8
// SM90-SAME:   attn.kernel_path = {path = "fp8", mma = "e4m3", reason = "e4m3 tensor cores, the generic kernel: scale blocks q 64, k 64, v 0: it takes q's per a multiple of 64 rows, k's and v's alike per a multiple of 128 (0: per tensor)"}
// SM90-SAME:   attn.rope_fusion = {q = "prerotate", k = "prerotate", reason = "the FP8 form: quantization kernels"}
// SM90:        attn.hadamard %q seed = 1 {placement = #attn.placement<prerotate>}
// SM90:        attn.quantize %v e4m3 block = 0 {placement = #attn.placement<prerotate>}
// INTERP:    attn.kernel_path = {path = "fp8", mma = "f32", reason = "sm {{0|80}} has no e4m3 tensor cores (or is the interpreter)"}
// SM90:      func.func @gluon
// SM90-SAME:   attn.kernel_path = {path = "fp8", mma = "e4m3", kernel = "gluon-sm90", min_len = 2048 : i64, reason = "e4m3 tensor cores, the sm90 Gluon kernel"}
// NOGLUON:   func.func @gluon
// NOGLUON-SAME: attn.kernel_path = {path = "fp8", mma = "e4m3", reason = "e4m3 tensor cores, the generic kernel: disabled (gluon=false)"}
// DECODE:    error: func @fp8 is in the FP8 form, which has no decode kernel: run it as a whole forward
// GRAD-NOT:  Traceback
// GRAD:      error: attn-autodiff: @fp8 is in the FP8 form (attn.hadamard), which is forward-only (inference): it has no backward

func.func @fp8(%q: tensor<?x8x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>) -> tensor<?x8x?x64xbf16> {
  %qh = attn.hadamard %q seed = 1 : tensor<?x8x?x64xbf16>
  %q8 = attn.quantize %qh e4m3 block = 64 : tensor<?x8x?x64xbf16>
  %kh = attn.hadamard %k seed = 1 : tensor<?x2x?x64xbf16>
  %k8 = attn.quantize %kh e4m3 block = 64 : tensor<?x2x?x64xbf16>
  %v8 = attn.quantize %v e4m3 block = 0 : tensor<?x2x?x64xbf16>
  %s = attn.qk %q8, %k8 : tensor<?x8x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<8>
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v8 : !attn.probs<8>, tensor<?x2x?x64xbf16> -> tensor<?x8x?x64xbf16>
  func.return %o : tensor<?x8x?x64xbf16>
}

// -----

func.func @gluon(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>) -> tensor<?x8x?x128xbf16> {
  %q8 = attn.quantize %q e4m3 block = 128 : tensor<?x8x?x128xbf16>
  %k8 = attn.quantize %k e4m3 block = 256 : tensor<?x2x?x128xbf16>
  %v8 = attn.quantize %v e4m3 block = 256 : tensor<?x2x?x128xbf16>
  %s = attn.qk %q8, %k8 : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v8 : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}
