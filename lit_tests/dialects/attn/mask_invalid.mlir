// RUN: ATTN_VERIFY

// Broken named attn.mask predicates, one per chunk (region forms are in
// region_invalid.mlir).

func.func @unknown_kind(%s: !attn.scores<4>) {
  %m = attn.mask %s lower_triangular : !attn.scores<4>
  func.return
}
// CHECK: attn.mask kind must be one of causal, sliding_window, prefix_lm, document, custom, got 'lower_triangular'

// -----

func.func @named_with_region(%s: !attn.scores<4>) {
  %m = attn.mask %s causal {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %t = arith.constant true
    attn.yield %t : i1
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.mask causal takes no region

// -----

func.func @causal_with_parameter(%s: !attn.scores<4>) {
  %m = attn.mask %s causal(3) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask causal takes no parameter

// -----

func.func @window_without_parameter(%s: !attn.scores<4>) {
  %m = attn.mask %s sliding_window : !attn.scores<4>
  func.return
}
// CHECK: attn.mask sliding_window needs an integer parameter

// -----

func.func @prefix_without_parameter(%s: !attn.scores<4>) {
  %m = attn.mask %s prefix_lm : !attn.scores<4>
  func.return
}
// CHECK: attn.mask prefix_lm needs an integer parameter

// -----

func.func @window_zero(%s: !attn.scores<4>) {
  %m = attn.mask %s sliding_window(0) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask sliding_window must be >= 1, got 0

// -----

func.func @window_negative(%s: !attn.scores<4>) {
  %m = attn.mask %s sliding_window(-8) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask sliding_window must be >= 1, got -8

// -----

func.func @prefix_negative(%s: !attn.scores<4>) {
  %m = attn.mask %s prefix_lm(-1) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask prefix_lm length must be >= 0, got -1

// -----

// Kernels compute positions in i32: a parameter must fit one.
func.func @window_over_i32(%s: !attn.scores<4>) {
  %m = attn.mask %s sliding_window(2147483648) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask sliding_window must be at most 2147483647 (kernels index in i32), got 2147483648

// -----

func.func @prefix_over_i32(%s: !attn.scores<4>) {
  %m = attn.mask %s prefix_lm(1099511627776) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask prefix_lm length must be at most 2147483647 (kernels index in i32), got 1099511627776

// -----

func.func @causal_with_extra(%s: !attn.scores<4>, %ids: tensor<?x?xi32>) {
  %m = attn.mask %s causal(%ids : tensor<?x?xi32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask causal takes 0 extra tensor(s), got 1

// -----

func.func @document_without_ids(%s: !attn.scores<4>) {
  %m = attn.mask %s document : !attn.scores<4>
  func.return
}
// CHECK: attn.mask document takes 1 extra tensor(s), got 0

// -----

func.func @document_two_ids(%s: !attn.scores<4>, %ids: tensor<?x?xi32>) {
  %m = attn.mask %s document(%ids : tensor<?x?xi32>, %ids : tensor<?x?xi32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask document takes 1 extra tensor(s), got 2

// -----

func.func @document_ids_rank1(%s: !attn.scores<4>, %ids: tensor<?xi32>) {
  %m = attn.mask %s document(%ids : tensor<?xi32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask document ids must be an integer tensor [B, Nk], got tensor<?xi32>

// -----

func.func @document_ids_float(%s: !attn.scores<4>, %ids: tensor<?x?xf32>) {
  %m = attn.mask %s document(%ids : tensor<?x?xf32>) : !attn.scores<4>
  func.return
}
// CHECK: attn.mask document ids must be an integer tensor [B, Nk], got tensor<?x?xf32>

// -----

func.func @result_type(%s: !attn.scores<4>) {
  %m = "attn.mask"(%s) <{kind = "causal"}> ({
  }) : (!attn.scores<4>) -> !attn.scores<8>
  func.return
}
// CHECK:      "attn.mask"
// CHECK:      Operation does not verify: result 'output' at position 0 does not verify:
// CHECK-NEXT: attribute !attn.scores<4> expected from variable 'T', but got !attn.scores<8>

// -----

func.func @mask_on_probs(%s: !attn.scores<4>) {
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  %m = "attn.mask"(%p) <{kind = "causal"}> ({
  }) : (!attn.probs<4>) -> !attn.probs<4>
  func.return
}
// CHECK:      operand 'input' at position 0 does not verify:
// CHECK-NEXT: !attn.probs<4> should be of base attribute attn.scores
