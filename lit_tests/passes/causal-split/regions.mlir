// RUN: attnfuse-opt %s --split-input-file -p causal-split | filecheck %s

// Custom region masks: a region that yields exactly `kv_idx <= q_idx` (either operand
// order) is causal; any other region is opaque, even when it implies causality.

func.func @causal_region(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %le = arith.cmpi sle, %ki, %qi : i32
    attn.yield %le : i1
  } : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @causal_region(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<causal>]}
// CHECK:         %m = attn.mask %s custom attributes {blocks = #attn.kv_bound<causal>} {
// CHECK-NEXT:    ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
// CHECK-NEXT:      %le = arith.cmpi sle, %ki, %qi : i32
// CHECK-NEXT:      attn.yield %le : i1
// CHECK-NEXT:    } : !attn.scores<2>

// -----

// q_idx >= kv_idx is the same predicate.
func.func @causal_region_sge(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %ge = arith.cmpi sge, %qi, %ki : i32
    attn.yield %ge : i1
  } : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @causal_region_sge(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<causal>]}

// -----

// Strictly causal (kv_idx < q_idx) is not the causal mask: opaque.
func.func @strict(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %lt = arith.cmpi slt, %ki, %qi : i32
    attn.yield %lt : i1
  } : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @strict(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<opaque>]}
// CHECK:         %m = attn.mask %s custom attributes {blocks = #attn.kv_bound<opaque>} {

// -----

// Reversed operands (q_idx <= kv_idx: anti-causal) must not be taken for causal.
func.func @anti_causal(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s custom {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32):
    %le = arith.cmpi sle, %qi, %ki : i32
    attn.yield %le : i1
  } : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @anti_causal(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<opaque>]}

// -----

// Causal and same-document in one region: correct but not bounded, so opaque.
func.func @causal_and_document(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>, %ids: tensor<?x?xi32>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %m = attn.mask %s custom(%ids : tensor<?x?xi32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %d: tensor<?x?xi32>):
    %dq = attn.extract %d[%b, %qi] : tensor<?x?xi32>
    %dk = attn.extract %d[%b, %ki] : tensor<?x?xi32>
    %same = arith.cmpi eq, %dq, %dk : i32
    %le = arith.cmpi sle, %ki, %qi : i32
    %keep = arith.andi %same, %le : i1
    attn.yield %keep : i1
  } : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK-LABEL: func.func @causal_and_document(
// CHECK-SAME:    attributes {attn.kv_blocks = [#attn.kv_bound<opaque>]}
