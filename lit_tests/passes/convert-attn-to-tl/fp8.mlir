// The fp8 path: a quantization kernel per quantized operand, then the generic forward on e4m3
// tiles. q and k (per block of 64 rows) are rotated by their Hadamard matrix (host tables of H and
// the signs; the signed tile split into two float16 parts, each multiplied by H) and quantized in
// one kernel each, which stores one scale per block; V (one scale for the tensor)
// takes a maxima kernel, the largest on the host, then its quantization kernel, and its e4m3 copy
// is channel-major. On sm 90 the products take e4m3 operands (P rounded to e4m3 too, the
// accumulator in units of V's scale); on the interpreter the same values are upcast to fp32.

// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=90}' | filecheck %s
// RUN: attnfuse-opt %s -p 'attnfuse-pipeline{sm=0}' | filecheck %s --check-prefix=INTERP
// RUN: sed -e 's/block = 64/block = 128/; s/block = 0 :/block = 128 :/' %s | attnfuse-opt -p 'attnfuse-pipeline{sm=90}' | filecheck %s --check-prefix=GLUON

// CHECK:      tl.kernel @quantize_q(%q: !tl.ptr<bf16>, {{.*}}, %q8: !tl.ptr<f8E4M3FN>, {{.*}}, %NQ: i32, %hadamard_1_h: !tl.ptr<f16>, %hadamard_1_s: !tl.ptr<f32>, %SCALE: !tl.ptr<f32>)
// CHECK:        %x_hi = tl.cast {{.*}} : !tl.tile<f32> -> !tl.tile<f16>
// CHECK:        %x_lo = tl.cast {{.*}} : !tl.tile<f32> -> !tl.tile<f16>
// CHECK:        %[[LO:.*]] = tl.dot %x_lo, %hadamard
// CHECK:        %[[Y:.*]] = tl.dot %x_hi, %hadamard acc %[[LO]]
// CHECK:        %x_rotated = tl.mul %[[Y]]
// CHECK:        %scale = tl.where
// CHECK:        tl.store %scale, {{.*}} : !tl.tile<f32>, !tl.ptr<f32>
// CHECK:        %q_scaled = tl.minimum
// CHECK:        %q8_1 = tl.cast %q_scaled : !tl.tile<f32> -> !tl.tile<f8E4M3FN>
// CHECK:        tl.store %q8_1, %q8_ptr
// CHECK:      tl.kernel @quantize_k(
// CHECK:      tl.kernel @amax_v(%v: !tl.ptr<bf16>, {{.*}}, %NK: i32, %AMAX: !tl.ptr<f32>)
// CHECK:        tl.store %amax
// CHECK:      tl.kernel @quantize_v(
// CHECK:        %amax = tl.load %AMAX
// CHECK:        tl.store %scale, %SCALE mask
// CHECK:      tl.kernel @attn_fwd(%q8: !tl.ptr<f8E4M3FN>, {{.*}}, %k8: !tl.ptr<f8E4M3FN>, {{.*}}, %v8: !tl.ptr<f8E4M3FN>, {{.*}}, %q_scale: !tl.ptr<f32>, %k_scale: !tl.ptr<f32>, %v_scale: !tl.ptr<f32>)
// CHECK:        %sq = tl.load
// CHECK:        %sv = tl.load %v_scale
// CHECK:        tl.for
// CHECK:          %qk8 = tl.dot %q8_1, %k : !tl.tile<f8E4M3FN>, !tl.tile<f8E4M3FN> -> !tl.tile<f32>
// CHECK:          %sk_n = tl.load
// CHECK:          %p8 = tl.cast {{.*}} : !tl.tile<f32> -> !tl.tile<f8E4M3FN>
// CHECK:          %acc_units = tl.mul %acc_scaled
// CHECK:          %acc_new = tl.dot %p8, %v8_1 acc %acc_units
// CHECK:        %acc_out = tl.mul
// CHECK:      tl.launcher "launch"(["q", "k", "v"])
// CHECK:        tl.alloc "q8" shape ["q.shape[0]", "8", "q.shape[2]", "64"] dtype "torch.float8_e4m3fn"
// CHECK:        tl.alloc "q_scale" shape ["q.shape[0] * 8 * _cdiv(q.shape[2], 64)"]
// CHECK:        tl.alloc "v8" shape ["v.shape[0]", "2", "64", "v.shape[2]"] dtype "torch.float8_e4m3fn"
// CHECK-NEXT:   tl.host_assign "v8" = "v8.transpose(2, 3)"
// CHECK:        tl.alloc "v_scale" shape ["1"]
// CHECK:        tl.hadamard_table "hadamard_1" d 64 seed 1 device "q.device"
// CHECK:        tl.call "quantize_q"
// CHECK:        tl.call "quantize_k"
// CHECK:        tl.call "amax_v"
// CHECK-NEXT:   tl.host_assign "v_amax_all" = "v_amax.amax(0, keepdim=True) if v_amax.numel() else v_amax.new_zeros(1)"
// CHECK-NEXT:   tl.call "quantize_v"
// CHECK-NEXT:   tl.call "attn_fwd"

// With scale blocks the Gluon kernel tiles (128 rows of q, k and v here: the sed above), kernel-path
// gives it the attention on sm 90, for the calls it covers.
// GLUON:      tl.host_if "_gluon_fits(q, k, v, 2048)" {
// GLUON-NEXT:   tl.gluon_attention "q8", "k8", "v8" -> "out", "lse" scale 1.250000e-01 causal fp8 ["q_scale", "k_scale", "v_scale", "128", "128"]
// GLUON-NEXT: } else {
// GLUON-NEXT:   tl.call "attn_fwd"

// INTERP:     tl.kernel @attn_fwd(
// INTERP:       %qk8 = tl.dot {{.*}} {input_precision = "ieee"} : !tl.tile<f32>, !tl.tile<f32> -> !tl.tile<f32>
// INTERP:       %e4m3_spacing = tl.exp2
// INTERP:       %p8 = tl.cast {{.*}} : !tl.tile<f32> -> !tl.tile<f8E4M3FN>

func.func @fp8(%q: tensor<?x8x?x64xbf16>, %k: tensor<?x2x?x64xbf16>, %v: tensor<?x2x?x64xbf16>) -> tensor<?x8x?x64xbf16> {
  %qh = attn.hadamard %q seed = 1 : tensor<?x8x?x64xbf16>
  %q8 = attn.quantize %qh e4m3 block = 64 : tensor<?x8x?x64xbf16>
  %kh = attn.hadamard %k seed = 1 : tensor<?x2x?x64xbf16>
  %k8 = attn.quantize %kh e4m3 block = 64 : tensor<?x2x?x64xbf16>
  %v8 = attn.quantize %v e4m3 block = 0 : tensor<?x2x?x64xbf16>
  %s = attn.qk %q8, %k8 : tensor<?x8x?x64xbf16>, tensor<?x2x?x64xbf16> -> !attn.scores<8>
  %m = attn.mask %s causal : !attn.scores<8>
  %p = attn.softmax %m : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v8 : !attn.probs<8>, tensor<?x2x?x64xbf16> -> tensor<?x8x?x64xbf16>
  func.return %o : tensor<?x8x?x64xbf16>
}
