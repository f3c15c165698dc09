// RUN: ATTN_VERIFY

// Broken region (custom) forms of attn.mask, attn.bias and attn.score_mod, and
// misplaced attn.extract / attn.yield, one per chunk.

func.func @custom_with_parameter(%s: !attn.scores<4>) {
  %m = attn.mask %s custom(3) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %t = arith.constant true
    attn.yield %t : i1
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.mask custom form takes no integer parameter

// -----

func.func @custom_without_region(%s: !attn.scores<4>) {
  %m = attn.mask %s custom : !attn.scores<4>
  func.return
}
// CHECK: attn.mask custom form needs a region

// -----

func.func @score_mod_without_region(%s: !attn.scores<4>) {
  %m = attn.score_mod %s : !attn.scores<4>
  func.return
}
// CHECK: attn.score_mod custom form needs a region

// -----

func.func @mask_region_yields_float(%s: !attn.scores<4>) {
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %one = arith.constant 1.0 : f32
    attn.yield %one : f32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.mask region must yield i1, got f32

// -----

func.func @mask_region_yields_i32(%s: !attn.scores<4>) {
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %d = arith.subi %qi, %ki : i32
    attn.yield %d : i32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.mask region must yield i1, got i32

// -----

func.func @score_mod_region_yields_int(%s: !attn.scores<4>) {
  %m = attn.score_mod %s {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    attn.yield %qi : i32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.score_mod region must yield a float, got i32

// -----

func.func @score_mod_region_yields_bool(%s: !attn.scores<4>) {
  %m = attn.score_mod %s {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.cmpi sle, %ki, %qi : i32
    attn.yield %c : i1
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.score_mod region must yield a float, got i1

// -----

func.func @bias_region_yields_int(%s: !attn.scores<4>) {
  %m = attn.bias %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %d = arith.subi %ki, %qi : i32
    attn.yield %d : i32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.bias region must yield a float, got i32

// -----

func.func @yield_two_values(%s: !attn.scores<4>) {
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %t = arith.constant true
    attn.yield %t, %t : i1, i1
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.mask region must end with attn.yield of one value

// -----

func.func @yield_nothing(%s: !attn.scores<4>) {
  %m = attn.bias %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    attn.yield
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.bias region must end with attn.yield of one value

// -----

// A mask region takes no score argument.
func.func @mask_region_with_score_arg(%s: !attn.scores<4>) {
  %m = attn.mask %s custom {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %t = arith.constant true
    attn.yield %t : i1
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.mask region must take (b, h, q_idx, kv_idx: i32, then one argument per extra tensor): expected (i32, i32, i32, i32), got (f32, i32, i32, i32, i32)

// -----

// A score_mod region starts with the score.
func.func @score_mod_region_without_score_arg(%s: !attn.scores<4>) {
  %m = attn.score_mod %s {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %z = arith.constant 0.0 : f32
    attn.yield %z : f32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.score_mod region must take (score: f32, b, h, q_idx, kv_idx: i32, then one argument per extra tensor): expected (f32, i32, i32, i32, i32), got (i32, i32, i32, i32)

// -----

// Index arguments are i32, not index.
func.func @region_index_args(%s: !attn.scores<4>) {
  %m = attn.mask %s custom {
  ^bb0(%b: index, %h: index, %qi: index, %ki: index):
    %c = arith.cmpi sle, %ki, %qi : index
    attn.yield %c : i1
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.mask region must take (b, h, q_idx, kv_idx: i32, then one argument per extra tensor): expected (i32, i32, i32, i32), got (index, index, index, index)

// -----

// Every extra tensor needs its block argument, of the same type.
func.func @region_missing_extra_arg(%s: !attn.scores<4>, %sl: tensor<4xf32>) {
  %m = attn.bias %s custom(%sl : tensor<4xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %z = arith.constant 0.0 : f32
    attn.yield %z : f32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.bias region must take (b, h, q_idx, kv_idx: i32, then one argument per extra tensor): expected (i32, i32, i32, i32, tensor<4xf32>), got (i32, i32, i32, i32)

// -----

func.func @region_extra_arg_type(%s: !attn.scores<4>, %sl: tensor<4xf32>) {
  %m = attn.bias %s custom(%sl : tensor<4xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<4xf16>):
    %z = arith.constant 0.0 : f32
    attn.yield %z : f32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.bias region must take (b, h, q_idx, kv_idx: i32, then one argument per extra tensor): expected (i32, i32, i32, i32, tensor<4xf32>), got (i32, i32, i32, i32, tensor<4xf16>)

// -----

func.func @extract_index_count(%s: !attn.scores<4>, %ids: tensor<?x?xi32>) {
  %m = attn.mask %s custom(%ids : tensor<?x?xi32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %d: tensor<?x?xi32>):
    %dq = attn.extract %d[%qi] : tensor<?x?xi32>
    %c = arith.cmpi eq, %dq, %dq : i32
    attn.yield %c : i1
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.extract needs 2 indices for tensor<?x?xi32>, got 1

// -----

func.func @extract_index_type(%s: !attn.scores<4>, %sl: tensor<4xf32>) {
  %m = attn.bias %s custom(%sl : tensor<4xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<4xf32>):
    %h64 = arith.extsi %h : i32 to i64
    %v = "attn.extract"(%t, %h64) : (tensor<4xf32>, i64) -> f32
    attn.yield %v : f32
  } : !attn.scores<4>
  func.return
}
// CHECK:      "attn.extract"(%t, %h64)
// CHECK:      Operation does not verify: operand 'indices' at position 1 does not verify:
// CHECK-NEXT: Expected attribute i32 but got i64

// -----

func.func @extract_result_type(%s: !attn.scores<4>, %sl: tensor<4xf32>) {
  %m = attn.bias %s custom(%sl : tensor<4xf32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %t: tensor<4xf32>):
    %v = "attn.extract"(%t, %h) : (tensor<4xf32>, i32) -> f16
    %w = arith.extf %v : f16 to f32
    attn.yield %w : f32
  } : !attn.scores<4>
  func.return
}
// CHECK:      "attn.extract"(%t, %h)
// CHECK:      Operation does not verify: result 'result' at position 0 does not verify:
// CHECK-NEXT: attribute f32 expected from variable 'T', but got f16

// -----

func.func @extract_outside_region(%sl: tensor<4xf32>, %h: i32) {
  %v = attn.extract %sl[%h] : tensor<4xf32>
  func.return
}
// CHECK: attn.extract must be inside a mask, bias or score_mod region

// -----

// Extra tensors reach the region through its block arguments only.
func.func @extract_value_from_outside(%s: !attn.scores<4>, %sl: tensor<4xf32>) {
  %m = attn.bias %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %v = attn.extract %sl[%h] : tensor<4xf32>
    attn.yield %v : f32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.extract must read an extra tensor through an argument of its attn.bias region, not a value from outside the region

// -----

func.func @yield_outside_region(%x: f32) {
  attn.yield %x : f32
}
// CHECK: 'attn.yield' expects parent op to be one of 'attn.mask', 'attn.bias', 'attn.score_mod'

// -----

// Only the ops of attn.REGION_OPS may appear in a region.
func.func @op_outside_the_allow_list(%s: !attn.scores<4>) {
  %t = attn.score_mod %s {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    %y = math.atan %x : f32
    attn.yield %y : f32
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.score_mod region may not hold 'math.atan'; allowed: arith.addf, arith.addi,

// -----

func.func @nested_region(%s: !attn.scores<4>) {
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %c = arith.cmpi sle, %ki, %qi : i32
    %r = scf.if %c -> (i1) {
      scf.yield %c : i1
    } else {
      scf.yield %c : i1
    }
    attn.yield %r : i1
  } : !attn.scores<4>
  func.return
}
// CHECK: attn.mask region may not hold 'scf.if'
