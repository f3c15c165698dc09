// kernel-path: on sm 90 an attention in bf16/fp16 with head dim 64, 128 or 256 (head-dims narrows them)
// takes the Gluon kernel (with the shortest length it runs), whatever its masks, score ops and
// sink; anything else keeps the generic Triton kernel, and the attribute says why.

// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 seq-len=4096}' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=80 seq-len=4096}' | filecheck %s --check-prefix=SM80
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=0}' | filecheck %s --check-prefix=INTERP
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 seq-len=1024}' | filecheck %s --check-prefix=SHORT
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 seq-len=256}' | filecheck %s --check-prefix=TINY
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 seq-len=4096 min-len-transformed=512}' | filecheck %s --check-prefix=MINLEN
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 gluon=false}' | filecheck %s --check-prefix=OFF
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 head-dims=128,256}' | filecheck %s --check-prefix=NO64
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 head-dims=128}' | filecheck %s --check-prefix=D128
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=90 tanh=exact}' | filecheck %s --check-prefix=EXACT
// RUN: attnfuse-opt %s --split-input-file -p 'kernel-path{sm=80 tanh=approx}' | filecheck %s --check-prefix=APPROX
//
// A variant with a tanh (softcap, math.tanh in a region) in bf16/f16 for a GPU gets
// `tanh = "approx-gluon"` where the Gluon kernel is chosen (tanh=auto) or `tanh = "approx"` on
// any kernel (tanh=approx): not for the interpreter, f32 inputs or tanh=exact.

// Llama-3: RoPE (Q's in the Gluon kernel, K's pre-rotated), causal, GQA. Its plain RoPE adds
// no launch, so the shortest length is as without Q transforms: the forward's, the smaller of
// min-len (2048) and min-len-fwd (512).
// CHECK:  func.func @llama({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
// SM80:   attn.kernel_path = {path = "triton", reason = "sm 80: the Gluon kernel is for sm 90 (Hopper)"}
// INTERP: attn.kernel_path = {path = "triton", reason = "sm 0: the Gluon kernel is for sm 90 (Hopper)"}
// SHORT:  attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}
// TINY:   attn.kernel_path = {path = "triton", reason = "compiled for N <= 256, below the Gluon kernel's min-len 512"}
// MINLEN: attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}
// OFF:    attn.kernel_path = {path = "triton", reason = "disabled (gluon=false)"}
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

// QK-norm then RoPE (Qwen3): the Gluon kernel applies both to Q itself, so min-len-fwd (512).
// CHECK:  func.func @qknorm({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
func.func @qknorm(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>, %wq: tensor<128xf32>, %wk: tensor<128xf32>) -> tensor<?x8x?x128xbf16> {
  %qn = attn.norm %q eps = 1.0e-06 weight(%wq : tensor<128xf32>) : tensor<?x8x?x128xbf16>
  %qr = attn.rope %qn half theta = 1000000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %kn = attn.norm %k eps = 1.0e-06 weight(%wk : tensor<128xf32>) : tensor<?x8x?x128xbf16>
  %kr = attn.rope %kn half theta = 1000000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x8x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// -----

// An interleaved RoPE is not the Gluon kernel's: Q is rotated by a pre-rotation kernel before
// it, so the shortest length is min-len-transformed (4096).
// CHECK:  func.func @interleaved({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 4096 : i64}}
// SHORT:  attn.kernel_path = {path = "triton", reason = "compiled for N <= 1024, below the Gluon kernel's min-len 4096"}
// MINLEN: func.func @interleaved({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
func.func @interleaved(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x8x?x128xbf16>, %v: tensor<?x8x?x128xbf16>) -> tensor<?x8x?x128xbf16> {
  %qr = attn.rope %q interleaved theta = 10000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %kr = attn.rope %k interleaved theta = 10000.0 rotary_dim = 128 : tensor<?x8x?x128xbf16>
  %s = attn.qk %qr, %kr : tensor<?x8x?x128xbf16>, tensor<?x8x?x128xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x128xbf16> -> tensor<?x8x?x128xbf16>
  func.return %o : tensor<?x8x?x128xbf16>
}

// -----

// No mask at all, fp16, head dim 64: the Gluon kernel (min-len-fwd at every head dim), unless
// head-dims leaves 64 out.
// CHECK:  func.func @full({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
// SHORT:  func.func @full({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
// NO64:   func.func @full({{.*}} attributes {attn.kernel_path = {path = "triton", reason = "head dim 64: not among kernel-path's head-dims [128, 256]"}}
func.func @full(%q: tensor<?x12x?x64xf16>, %k: tensor<?x12x?x64xf16>, %v: tensor<?x12x?x64xf16>) -> tensor<?x12x?x64xf16> {
  %s = attn.qk %q, %k : tensor<?x12x?x64xf16>, tensor<?x12x?x64xf16> -> !attn.scores<12>
  %p = attn.softmax %s : !attn.scores<12> -> !attn.probs<12>
  %o = attn.pv %p, %v : !attn.probs<12>, tensor<?x12x?x64xf16> -> tensor<?x12x?x64xf16>
  func.return %o : tensor<?x12x?x64xf16>
}

// -----

// Score ops and sinks: the Gluon kernel takes them as generated functions (convert-attn-to-tl).
// CHECK:  func.func @window({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
func.func @window(%q: tensor<?x4x?x128xbf16>, %k: tensor<?x4x?x128xbf16>, %v: tensor<?x4x?x128xbf16>) -> tensor<?x4x?x128xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xbf16>, tensor<?x4x?x128xbf16> -> !attn.scores<4>
  %m = attn.mask %s sliding_window(1024) : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xbf16> -> tensor<?x4x?x128xbf16>
  func.return %o : tensor<?x4x?x128xbf16>
}

// -----

// CHECK:  func.func @softcap({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64, tanh = "approx-gluon"}}
// SM80:   func.func @softcap({{.*}} attributes {attn.kernel_path = {path = "triton", reason = "sm 80: the Gluon kernel is for sm 90 (Hopper)"}}
// APPROX: func.func @softcap({{.*}} attributes {attn.kernel_path = {path = "triton", reason = "sm 80: the Gluon kernel is for sm 90 (Hopper)", tanh = "approx"}}
// INTERP: func.func @softcap({{.*}} attributes {attn.kernel_path = {path = "triton", reason = "sm 0: the Gluon kernel is for sm 90 (Hopper)"}}
// EXACT:  func.func @softcap({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
func.func @softcap(%q: tensor<?x4x?x128xbf16>, %k: tensor<?x4x?x128xbf16>, %v: tensor<?x4x?x128xbf16>) -> tensor<?x4x?x128xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xbf16>, tensor<?x4x?x128xbf16> -> !attn.scores<4>
  %c = attn.softcap %s cap = 50.0 : !attn.scores<4>
  %m = attn.mask %c causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xbf16> -> tensor<?x4x?x128xbf16>
  func.return %o : tensor<?x4x?x128xbf16>
}

// -----

// CHECK:  func.func @sink({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
func.func @sink(%q: tensor<?x4x?x128xbf16>, %k: tensor<?x4x?x128xbf16>, %v: tensor<?x4x?x128xbf16>, %sink: tensor<4xf32>) -> tensor<?x4x?x128xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xbf16>, tensor<?x4x?x128xbf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m sink(%sink : tensor<4xf32>) : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xbf16> -> tensor<?x4x?x128xbf16>
  func.return %o : tensor<?x4x?x128xbf16>
}

// -----

// CHECK:  func.func @d256({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64}}
// D128:   attn.kernel_path = {path = "triton", reason = "head dim 256: not among kernel-path's head-dims [128]"}
func.func @d256(%q: tensor<?x4x?x256xbf16>, %k: tensor<?x4x?x256xbf16>, %v: tensor<?x4x?x256xbf16>) -> tensor<?x4x?x256xbf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x256xbf16>, tensor<?x4x?x256xbf16> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x256xbf16> -> tensor<?x4x?x256xbf16>
  func.return %o : tensor<?x4x?x256xbf16>
}

// -----

// CHECK:  attn.kernel_path = {path = "triton", reason = "q, k and v are not all bf16 or all f16"}
func.func @f32(%q: tensor<?x4x?x128xf32>, %k: tensor<?x4x?x128xf32>, %v: tensor<?x4x?x128xf32>) -> tensor<?x4x?x128xf32> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xf32>, tensor<?x4x?x128xf32> -> !attn.scores<4>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xf32> -> tensor<?x4x?x128xf32>
  func.return %o : tensor<?x4x?x128xf32>
}

// -----

// CHECK:  func.func @tanh_f32({{.*}} attributes {attn.kernel_path = {path = "triton", reason = "q, k and v are not all bf16 or all f16"}}
// APPROX: func.func @tanh_f32({{.*}} attributes {attn.kernel_path = {path = "triton", reason = "sm 80: the Gluon kernel is for sm 90 (Hopper)"}}
func.func @tanh_f32(%q: tensor<?x4x?x128xf32>, %k: tensor<?x4x?x128xf32>, %v: tensor<?x4x?x128xf32>) -> tensor<?x4x?x128xf32> {
  %s = attn.qk %q, %k : tensor<?x4x?x128xf32>, tensor<?x4x?x128xf32> -> !attn.scores<4>
  %c = attn.softcap %s cap = 30.0 : !attn.scores<4>
  %p = attn.softmax %c : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x128xf32> -> tensor<?x4x?x128xf32>
  func.return %o : tensor<?x4x?x128xf32>
}

// -----

// A score_mod's math.tanh counts: on the Gluon kernel by default, on the generic one only with
// tanh=approx.
// CHECK:  func.func @tanh_mod({{.*}} attributes {attn.kernel_path = {path = "gluon-sm90", min_len = 512 : i64, tanh = "approx-gluon"}}
// D128:   func.func @tanh_mod({{.*}} attributes {attn.kernel_path = {path = "triton", reason = "head dim 256: not among kernel-path's head-dims [128]"}}
// APPROX: func.func @tanh_mod({{.*}} attributes {attn.kernel_path = {path = "triton", reason = "sm 80: the Gluon kernel is for sm 90 (Hopper)", tanh = "approx"}}
func.func @tanh_mod(%q: tensor<?x4x?x256xf16>, %k: tensor<?x4x?x256xf16>, %v: tensor<?x4x?x256xf16>) -> tensor<?x4x?x256xf16> {
  %s = attn.qk %q, %k : tensor<?x4x?x256xf16>, tensor<?x4x?x256xf16> -> !attn.scores<4>
  %t = attn.score_mod %s {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %y = math.tanh %x : f32
    attn.yield %y : f32
  } : !attn.scores<4>
  %p = attn.softmax %t : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x256xf16> -> tensor<?x4x?x256xf16>
  func.return %o : tensor<?x4x?x256xf16>
}
