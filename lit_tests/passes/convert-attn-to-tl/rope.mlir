// RUN: attnfuse-opt %s -p 'rope-fusion{mode=fused},causal-split,tiling{sm=0},convert-attn-to-tl' | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s -p 'rope-fusion{mode=prerotate},causal-split,tiling{sm=0},convert-attn-to-tl' | filecheck %s --check-prefix=PRE

// RoPE on q and k. Q is rotated once in the prologue either way (cos/sin read from
// host-built tables at the query positions). K is rotated in every KV-loop iteration
// when fused; with prerotate a second kernel, launched first, writes a rotated copy of
// K once and the attention kernel reads that copy with no rotation code.

func.func @rope(%q: tensor<?x4x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x4x?x16xf16> {
  %qr = attn.rope %q half theta = 10000.0 rotary_dim = 16 : tensor<?x4x?x16xf16>
  %kr = attn.rope %k half theta = 10000.0 rotary_dim = 16 : tensor<?x2x?x16xf16>
  %s = attn.qk %qr, %kr : tensor<?x4x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<4>
  %m = attn.mask %s causal : !attn.scores<4>
  %p = attn.softmax %m : !attn.scores<4> -> !attn.probs<4>
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x2x?x16xf16> -> tensor<?x4x?x16xf16>
  func.return %o : tensor<?x4x?x16xf16>
}

// FUSED:           tl.kernel @attn_fwd({{.*}}, %BLOCK_M: i32 constexpr, %BLOCK_N: i32 constexpr, %rope_0_cos: !tl.ptr<f32>, %rope_0_sin: !tl.ptr<f32>) {
// FUSED:             %q_cos = tl.load
// FUSED:             %q_rot = tl.add
// FUSED:             %q_tile = tl.cast
// Each of the three KV segments rotates the K tile it loads before the dot.
// FUSED:             tl.for %start_n =
// FUSED:               %k_cos = tl.load
// FUSED:               %k_rot = tl.add
// FUSED-NEXT:          %k_tile = tl.cast %k_rot : !tl.tile<f32> -> !tl.tile<f16>
// FUSED-NEXT:          %{{.*}} = tl.dot %q_tile, %k_tile :
// FUSED:             tl.for %start_n_1 =
// FUSED:               %k_cos_1 = tl.load
// FUSED:               %{{.*}} = tl.dot %q_tile, %k_tile_1 :
// FUSED-NOT:         tl.for %start_n_2 =
// FUSED:           tl.launcher "launch"(["q", "k", "v"]) {
// FUSED-NOT:         k_rot
// FUSED:             tl.rope_table "rope_0_cos", "rope_0_sin" inv_freq [1.000000e+00 : f32, 0.316227764 : f32, 1.000000e-01 : f32, 0.0316227749 : f32, 1.000000e-02 : f32, 0.00316227763 : f32, 1.000000e-03 : f32, 0.000316227757 : f32] length "max(q.shape[2], k.shape[2])" magnitude 1.000000e+00 device "q.device"
// FUSED-NEXT:        tl.call "attn_fwd"
// FUSED-SAME:          "k", "k.stride(0)", "k.stride(1)", "k.stride(2)", "k.stride(3)"
// FUSED-NEXT:        tl.host_return ["out", "lse"]

// The pre-rotation kernel: one program per (block of 64 K rows, batch x kv head).
// PRE:             tl.kernel @rotate_k(%k: !tl.ptr<f16>, %stride_k: i32, %stride_k_1: i32, %stride_k_2: i32, %stride_k_3: i32, %K_rot: !tl.ptr<f16>, %stride_kr: i32, %stride_kr_1: i32, %stride_kr_2: i32, %stride_kr_3: i32, %NK: i32, %BLOCK_N: i32 constexpr, %rope_0_cos: !tl.ptr<f32>, %rope_0_sin: !tl.ptr<f32>) {
// PRE:               %k_cos = tl.load
// PRE:               %k_rot = tl.add
// PRE:               tl.store %{{.*}}, %k_rot_ptr mask
// PRE-NEXT:          tl.return
// The attention kernel reads k_rot and rotates only q.
// PRE:             tl.kernel @attn_fwd({{.*}}, %k_rot: !tl.ptr<f16>, %stride_k_rot: i32, {{.*}}, %rope_0_cos: !tl.ptr<f32>, %rope_0_sin: !tl.ptr<f32>) {
// PRE:               %q_cos = tl.load
// PRE:               tl.for %start_n =
// PRE-NOT:           tl.add %rope_0_cos
// PRE-NOT:           %k_cos
// PRE:               tl.launcher
// PRE-NEXT:          tl.alloc "out"
// PRE-NEXT:          tl.alloc "lse"
// PRE-NEXT:          tl.alloc "k_rot" shape ["k.shape[0]", "2", "k.shape[2]", "16"] dtype "torch.float16" device "k.device"
// PRE-NEXT:          tl.rope_table "rope_0_cos", "rope_0_sin"
// PRE-NEXT:          tl.call "rotate_k" grid ["_cdiv(k.shape[2], 32)", "k.shape[0] * 2"] args ["k", "k.stride(0)", "k.stride(1)", "k.stride(2)", "k.stride(3)", "k_rot", "k_rot.stride(0)", "k_rot.stride(1)", "k_rot.stride(2)", "k_rot.stride(3)", "k.shape[2]", "32", "rope_0_cos", "rope_0_sin"] num_warps 4 num_stages 1
// PRE-NEXT:          tl.call "attn_fwd"
// PRE-SAME:            "k_rot", "k_rot.stride(0)", "k_rot.stride(1)", "k_rot.stride(2)", "k_rot.stride(3)"
// PRE-NEXT:          tl.host_return ["out", "lse"]
