// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// attn.bias in its named (ALiBi) and custom forms; attn.score_mod, whose region
// also takes the score, with and without extra tensors.

func.func @bias(%s: !attn.scores<4>, %slopes: tensor<4xf32>, %table: tensor<4x?xf16>) {
  %alibi = attn.bias %s alibi(%slopes : tensor<4xf32>) : !attn.scores<4>
  %rel = attn.bias %alibi custom(%table : tensor<4x?xf16>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<4x?xf16>):
    %dist = arith.subi %qi, %ki : i32
    %v = attn.extract %t[%h, %dist] : tensor<4x?xf16>
    attn.yield %v : f16
  } : !attn.scores<4>
  func.return
}

// CHECK-LABEL: func.func @bias(
// CHECK-NEXT:    %alibi = attn.bias %s alibi(%slopes : tensor<4xf32>) : !attn.scores<4>
// CHECK-NEXT:    %rel = attn.bias %alibi custom(%table : tensor<4x?xf16>) {
// CHECK-NEXT:    ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<4x?xf16>):
// CHECK-NEXT:      %dist = arith.subi %qi, %ki : i32
// CHECK-NEXT:      %v = attn.extract %t[%h, %dist] : tensor<4x?xf16>
// CHECK-NEXT:      attn.yield %v : f16
// CHECK-NEXT:    } : !attn.scores<4>
// CHECK-NEXT:    func.return

// CHECK-GENERIC-LABEL: "func.func"() <{sym_name = "bias"
// CHECK-GENERIC:         %alibi = "attn.bias"(%s, %slopes) <{kind = "alibi"}> ({
// CHECK-GENERIC-NEXT:    }) : (!attn.scores<4>, tensor<4xf32>) -> !attn.scores<4>
// CHECK-GENERIC-NEXT:    %rel = "attn.bias"(%alibi, %table) <{kind = "custom"}> ({

// -----

func.func @score_mod(%s: !attn.scores<2>, %w: tensor<2xf32>) {
  %capped = attn.score_mod %s {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %cap = arith.constant 30.0 : f32
    %y = arith.divf %x, %cap : f32
    %t = math.tanh %y : f32
    %z = arith.mulf %t, %cap : f32
    attn.yield %z : f32
  } : !attn.scores<2>
  %weighted = attn.score_mod %capped (%w : tensor<2xf32>) attributes {note = "per-head weight"} {
  ^bb0(%x2: f32, %b2: i32, %h2: i32, %qi2: i32, %ki2: i32, %wt: tensor<2xf32>):
    %wh = attn.extract %wt[%h2] : tensor<2xf32>
    %r = arith.mulf %x2, %wh : f32
    attn.yield %r : f32
  } : !attn.scores<2>
  func.return
}

// The custom keyword is optional on input and not printed: score_mod has no other form.
// CHECK-LABEL: func.func @score_mod(%s: !attn.scores<2>, %w: tensor<2xf32>) {
// CHECK-NEXT:    %capped = attn.score_mod %s {
// CHECK-NEXT:    ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
// CHECK-NEXT:      %cap = arith.constant 3.000000e+01 : f32
// CHECK-NEXT:      %y = arith.divf %x, %cap : f32
// CHECK-NEXT:      %t = math.tanh %y : f32
// CHECK-NEXT:      %z = arith.mulf %t, %cap : f32
// CHECK-NEXT:      attn.yield %z : f32
// CHECK-NEXT:    } : !attn.scores<2>
// CHECK-NEXT:    %weighted = attn.score_mod %capped(%w : tensor<2xf32>) attributes {note = "per-head weight"} {
// CHECK-NEXT:    ^bb0(%x2: f32, %b2: i32, %h2: i32, %qi2: i32, %ki2: i32, %wt: tensor<2xf32>):
// CHECK-NEXT:      %wh = attn.extract %wt[%h2] : tensor<2xf32>
// CHECK-NEXT:      %r = arith.mulf %x2, %wh : f32
// CHECK-NEXT:      attn.yield %r : f32
// CHECK-NEXT:    } : !attn.scores<2>

// CHECK-GENERIC-LABEL: "func.func"() <{sym_name = "score_mod"
// CHECK-GENERIC:         %capped = "attn.score_mod"(%s) <{kind = "custom"}> ({
// CHECK-GENERIC-NEXT:    ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
// CHECK-GENERIC:         %weighted = "attn.score_mod"(%capped, %w) <{kind = "custom"}> ({
// CHECK-GENERIC:         }) {note = "per-head weight"} : (!attn.scores<2>, tensor<2xf32>) -> !attn.scores<2>
