// RUN: attnfuse-opt %s | filecheck %s
// RUN: ATTN_ROUNDTRIP
// RUN: ATTN_GENERIC_ROUNDTRIP

// attn.mask: every named predicate and the custom region form, which reads an
// extra tensor with attn.extract and computes with arith ops.

func.func @named(%s: !attn.scores<8>, %ids: tensor<?x?xi32>, %ids64: tensor<2x?xi64>) {
  %causal = attn.mask %s causal : !attn.scores<8>
  %window = attn.mask %s sliding_window(128) : !attn.scores<8>
  %window1 = attn.mask %s sliding_window(1) : !attn.scores<8>
  %prefix = attn.mask %s prefix_lm(16) : !attn.scores<8>
  %prefix0 = attn.mask %s prefix_lm(0) : !attn.scores<8>
  %doc = attn.mask %s document(%ids : tensor<?x?xi32>) : !attn.scores<8>
  %doc64 = attn.mask %causal document(%ids64 : tensor<2x?xi64>) attributes {tag = 1 : i32} : !attn.scores<8>
  func.return
}

// CHECK-LABEL: func.func @named(
// CHECK-NEXT:    %causal = attn.mask %s causal : !attn.scores<8>
// CHECK-NEXT:    %window = attn.mask %s sliding_window(128) : !attn.scores<8>
// CHECK-NEXT:    %window1 = attn.mask %s sliding_window(1) : !attn.scores<8>
// CHECK-NEXT:    %prefix = attn.mask %s prefix_lm(16) : !attn.scores<8>
// CHECK-NEXT:    %prefix0 = attn.mask %s prefix_lm(0) : !attn.scores<8>
// CHECK-NEXT:    %doc = attn.mask %s document(%ids : tensor<?x?xi32>) : !attn.scores<8>
// CHECK-NEXT:    %doc64 = attn.mask %causal document(%ids64 : tensor<2x?xi64>) attributes {tag = 1 : i32} : !attn.scores<8>
// CHECK-NEXT:    func.return

// Named kinds carry an empty region in the generic form.
// CHECK-GENERIC-LABEL: "func.func"() <{sym_name = "named"
// CHECK-GENERIC:         %causal = "attn.mask"(%s) <{kind = "causal"}> ({
// CHECK-GENERIC-NEXT:    }) : (!attn.scores<8>) -> !attn.scores<8>
// CHECK-GENERIC-NEXT:    %window = "attn.mask"(%s) <{kind = "sliding_window", param = 128 : i64}> ({
// CHECK-GENERIC:         %doc = "attn.mask"(%s, %ids) <{kind = "document"}> ({

// -----

// A custom predicate: same document and causal, written out by hand. Discardable
// attributes take the `attributes` keyword, so they cannot be taken for the region.
func.func @custom(%s: !attn.scores<8>, %ids: tensor<?x?xi32>) {
  %m = attn.mask %s custom(%ids : tensor<?x?xi32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %d: tensor<?x?xi32>):
    %dq = attn.extract %d[%b, %qi] : tensor<?x?xi32>
    %dk = attn.extract %d[%b, %ki] : tensor<?x?xi32>
    %same = arith.cmpi eq, %dq, %dk : i32
    %causal = arith.cmpi sle, %ki, %qi : i32
    %keep = arith.andi %same, %causal : i1
    attn.yield %keep : i1
  } : !attn.scores<8>
  %n = attn.mask %m custom attributes {origin = "traced"} {
  ^bb0(%b2: i32, %h2: i32, %qi2: i32, %ki2: i32):
    %true = arith.constant true
    attn.yield %true : i1
  } : !attn.scores<8>
  func.return
}

// CHECK-LABEL: func.func @custom(%s: !attn.scores<8>, %ids: tensor<?x?xi32>) {
// CHECK-NEXT:    %m = attn.mask %s custom(%ids : tensor<?x?xi32>) {
// CHECK-NEXT:    ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %d: tensor<?x?xi32>):
// CHECK-NEXT:      %dq = attn.extract %d[%b, %qi] : tensor<?x?xi32>
// CHECK-NEXT:      %dk = attn.extract %d[%b, %ki] : tensor<?x?xi32>
// CHECK-NEXT:      %same = arith.cmpi eq, %dq, %dk : i32
// CHECK-NEXT:      %causal = arith.cmpi sle, %ki, %qi : i32
// CHECK-NEXT:      %keep = arith.andi %same, %causal : i1
// CHECK-NEXT:      attn.yield %keep : i1
// CHECK-NEXT:    } : !attn.scores<8>
// CHECK-NEXT:    %n = attn.mask %m custom attributes {origin = "traced"} {
// CHECK-NEXT:    ^bb0(%b2: i32, %h2: i32, %qi2: i32, %ki2: i32):
// CHECK-NEXT:      %true = arith.constant true
// CHECK-NEXT:      attn.yield %true : i1
// CHECK-NEXT:    } : !attn.scores<8>
// CHECK-NEXT:    func.return

// CHECK-GENERIC-LABEL: "func.func"() <{sym_name = "custom"
// CHECK-GENERIC:         %m = "attn.mask"(%s, %ids) <{kind = "custom"}> ({
// CHECK-GENERIC-NEXT:    ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %d: tensor<?x?xi32>):
// CHECK-GENERIC-NEXT:      %dq = "attn.extract"(%d, %b, %qi) : (tensor<?x?xi32>, i32, i32) -> i32
// CHECK-GENERIC:           "attn.yield"(%keep) : (i1) -> ()
// CHECK-GENERIC-NEXT:    }) : (!attn.scores<8>, tensor<?x?xi32>) -> !attn.scores<8>
