// RUN: ATTN_VERIFY

// Broken attn.softmax and attn.pv ops, one per chunk.

func.func @softmax_result_heads(%s: !attn.scores<8>) {
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<4>
  func.return
}
// CHECK: attn.softmax result must be !attn.probs<8>

// -----

func.func @sink_wrong_heads(%s: !attn.scores<8>, %sink: tensor<4xf32>) {
  %p = attn.softmax %s sink(%sink : tensor<4xf32>) : !attn.scores<8> -> !attn.probs<8>
  func.return
}
// CHECK: attn.softmax sink must be a float tensor<8x...> (one logit per query head), got tensor<4xf32>

// -----

func.func @sink_int(%s: !attn.scores<8>, %sink: tensor<8xi32>) {
  %p = attn.softmax %s sink(%sink : tensor<8xi32>) : !attn.scores<8> -> !attn.probs<8>
  func.return
}
// CHECK: attn.softmax sink must be a float tensor<8x...> (one logit per query head), got tensor<8xi32>

// -----

func.func @sink_rank2(%s: !attn.scores<8>, %sink: tensor<1x8xf32>) {
  %p = attn.softmax %s sink(%sink : tensor<1x8xf32>) : !attn.scores<8> -> !attn.probs<8>
  func.return
}
// CHECK: attn.softmax sink must be a float tensor<8x...> (one logit per query head), got tensor<1x8xf32>

// -----

// Probabilities that come from outside (an argument) are not softmax output.
func.func @pv_fed_by_argument(%p: !attn.probs<8>, %v: tensor<?x8x?x64xf16>) {
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf16>
  func.return
}
// CHECK: attn.pv must be fed by an attn.softmax result

// -----

func.func @pv_fed_by_other_op(%v: tensor<?x8x?x64xf16>) {
  %p = "test.op"() : () -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xf16>
  func.return
}
// CHECK: attn.pv must be fed by an attn.softmax result

// -----

func.func @pv_heads_not_a_multiple(%s: !attn.scores<8>, %v: tensor<?x3x?x64xf16>) {
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x3x?x64xf16> -> tensor<?x8x?x64xf16>
  func.return
}
// CHECK: attn.pv probs heads (8) must be a multiple of v heads (3)

// -----

func.func @pv_result_heads(%s: !attn.scores<8>, %v: tensor<?x2x?x64xf16>) {
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x64xf16> -> tensor<?x2x?x64xf16>
  func.return
}
// CHECK: attn.pv result must have 8 heads and head dim 64 (v's), got tensor<?x2x?x64xf16>

// -----

func.func @pv_result_head_dim(%s: !attn.scores<8>, %v: tensor<?x8x?x64xf16>) {
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x64xf16> -> tensor<?x8x?x128xf16>
  func.return
}
// CHECK: attn.pv result must have 8 heads and head dim 64 (v's), got tensor<?x8x?x128xf16>

// -----

func.func @pv_v_rank3(%s: !attn.scores<8>, %v: tensor<?x8x64xf16>) {
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x64xf16> -> tensor<?x8x?x64xf16>
  func.return
}
// CHECK: attn.pv v must be a rank-4 tensor [B, H, N, D], got tensor<?x8x64xf16>

// -----

func.func @pv_result_int(%s: !attn.scores<8>, %v: tensor<?x8x?x64xf16>) {
  %p = attn.softmax %s : !attn.scores<8> -> !attn.probs<8>
  %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x8x?x64xf16> -> tensor<?x8x?x64xi16>
  func.return
}
// CHECK: attn.pv result must have a float element type, got tensor<?x8x?x64xi16>

// -----

func.func @no_heads(%p: !attn.probs<0>) {
  func.return
}
// CHECK: !attn.probs needs at least one head, got 0
