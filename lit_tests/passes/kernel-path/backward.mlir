// kernel-path on a backward function (attn-autodiff's): on sm 90 the Gluon backward (dK/dV and
// ordered dQ kernels) takes every variant the Gluon forward takes, at head dims 64 and 128,
// when the function asks for dq, dk and dv together; dQ by TMA reduce-adds (dq-reduce, the
// default) is recorded as dq = "reduce".

// RUN: attnfuse-opt %s --split-input-file -p 'attn-autodiff,kernel-path{sm=90 seq-len=4096 dq-reduce=false}' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'attn-autodiff,kernel-path{sm=90 seq-len=4096}' | filecheck %s --check-prefix=REDUCE
// RUN: attnfuse-opt %s --split-input-file -p 'attn-autodiff{wrt=2},kernel-path{sm=90 seq-len=4096}' | filecheck %s --check-prefix=DV
// RUN: attnfuse-opt %s --split-input-file -p 'attn-autodiff,kernel-path{sm=80 seq-len=4096}' | filecheck %s --check-prefix=SM80
// RUN: attnfuse-opt %s --split-input-file -p 'attn-autodiff,kernel-path{sm=90 seq-len=1024}' | filecheck %s --check-prefix=SHORT

// Llama-3 (RoPE, causal, GQA): the backward pre-rotates Q and K, so min-len is 2048 as without
// Q transforms.
// CHECK:  func.func @llama_grad({{.*}} attributes {attn.wrt = array<i64: 0, 1, 2>, attn.kernel_path = {path = "gluon-sm90", min_len = 2048 : i64}}
// REDUCE: attn.kernel_path = {path = "gluon-sm90", min_len = 2048 : i64, dq = "reduce"}
// DV:     attn.kernel_path = {path = "triton", reason = "a backward that does not ask for dq, dk and dv (the Gluon backward computes them together)"}
// SM80:   attn.kernel_path = {path = "triton", reason = "sm 80: the Gluon kernel is for sm 90 (Hopper)"}
// SHORT:  attn.kernel_path = {path = "triton", reason = "compiled for N <= 1024, below the Gluon kernel's min-len 2048"}
func.func @llama(%q: tensor<?x32x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x32x?x128xbf16> {
  %qr = attn.rope %q half theta = 500000.0 rotary_dim = 128 : tensor<?x32x?x128xbf16>
  %kr = attn.rope %k half theta = 500000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x32x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<32>
  %m = attn.mask %s causal : !attn.scores<32>
  %p = attn.softmax %m : !attn.scores<32> -> !attn.probs<32>
  %o = attn.pv %p, %v : !attn.probs<32>, tensor<?x8x?x128xbf16> -> tensor<?x32x?x128xbf16>
  func.return %o : tensor<?x32x?x128xbf16>
}

// -----

// Head dim 64 (the paper's shape), fp16, a window and a softcap: the Gluon backward (the
// forward's default head dims are 128 only; the backward measured faster at 64 too), its tanh
// by the approximate instruction in the Gluon kernels' functions.
// CHECK:  func.func @gemma_grad({{.*}} attn.kernel_path = {path = "gluon-sm90", min_len = 2048 : i64, tanh = "approx-gluon"}
func.func @gemma(%q: tensor<?x4x?x64xf16>, %k: tensor<?x4x?x64xf16>, %v: tensor<?x4x?x64xf16>) -> tensor<?x4x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x64xf16>, tensor<?x4x?x64xf16> -> !attn.scores<4>
  %c = attn.softcap %s cap = 50.0 : !attn.scores<4>
  %m = attn.mask %c sliding_window(1024) : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x64xf16> -> tensor<?x4x?x64xf16>
  func.return %o : tensor<?x4x?x64xf16>
}

// -----

// f32: the generic backward.
// CHECK:  func.func @f32_grad({{.*}} attn.kernel_path = {path = "triton", reason = "q, k and v are not all bf16 or all f16"}
func.func @f32(%q: tensor<?x4x?x64xf32>, %k: tensor<?x4x?x64xf32>, %v: tensor<?x4x?x64xf32>) -> tensor<?x4x?x64xf32> {
  %s = attn.qk %q, %k : tensor<?x4x?x64xf32>, tensor<?x4x?x64xf32> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x64xf32> -> tensor<?x4x?x64xf32>
  func.return %o : tensor<?x4x?x64xf32>
}
