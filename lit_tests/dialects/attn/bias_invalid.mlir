// RUN: ATTN_VERIFY

// Broken named attn.bias and attn.score_mod ops, one per chunk (region forms are in
// region_invalid.mlir).

func.func @unknown_kind(%s: !attn.scores<4>, %t: tensor<4xf32>) {
  %b = attn.bias %s relative(%t : tensor<4xf32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.bias kind must be one of alibi, custom, got 'relative'

// -----

func.func @alibi_without_slopes(%s: !attn.scores<4>) {
  %b = attn.bias %s alibi : !attn.scores<4>
  func.return
}
// CHECK: attn.bias alibi takes 1 extra tensor(s), got 0

// -----

func.func @alibi_with_parameter(%s: !attn.scores<4>, %sl: tensor<4xf32>) {
  %b = attn.bias %s alibi(8)(%sl : tensor<4xf32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.bias alibi takes no parameter

// -----

func.func @alibi_slopes_wrong_heads(%s: !attn.scores<4>, %sl: tensor<8xf32>) {
  %b = attn.bias %s alibi(%sl : tensor<8xf32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.bias alibi slopes must be a float tensor<4x...> (one per head), got tensor<8xf32>

// -----

func.func @alibi_slopes_int(%s: !attn.scores<4>, %sl: tensor<4xi32>) {
  %b = attn.bias %s alibi(%sl : tensor<4xi32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.bias alibi slopes must be a float tensor<4x...> (one per head), got tensor<4xi32>

// -----

func.func @alibi_slopes_rank2(%s: !attn.scores<4>, %sl: tensor<1x4xf32>) {
  %b = attn.bias %s alibi(%sl : tensor<1x4xf32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.bias alibi slopes must be a float tensor<4x...> (one per head), got tensor<1x4xf32>

// -----

func.func @alibi_with_region(%s: !attn.scores<4>, %sl: tensor<4xf32>) {
  %b = attn.bias %s alibi(%sl : tensor<4xf32>) {
  ^bb0(%b0: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<4xf32>):
    %z = arith.constant 0.0 : f32
    attn.yield %z : f32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.bias alibi takes no region

// -----

func.func @bias_result_type(%s: !attn.scores<4>, %sl: tensor<4xf32>) {
  %b = "attn.bias"(%s, %sl) <{kind = "alibi"}> ({
  }) : (!attn.scores<4>, tensor<4xf32>) -> !attn.scores<2>
  func.return
}
// CHECK:      "attn.bias"
// CHECK:      Operation does not verify: result 'output' at position 0 does not verify:
// CHECK-NEXT: attribute !attn.scores<4> expected from variable 'T', but got !attn.scores<2>

// -----

// score_mod has no named forms.
func.func @score_mod_named(%s: !attn.scores<4>) {
  %m = "attn.score_mod"(%s) <{kind = "causal"}> ({
  }) : (!attn.scores<4>) -> !attn.scores<4>
  func.return
}
// CHECK: attn.score_mod kind must be one of custom, got 'causal'
