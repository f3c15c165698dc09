// --verify-diagnostics fails when the annotations are not met, as mlir-opt's does: an
// error no annotation expects, and an annotation whose error is not produced (a wrong
// message, a wrong line, or valid IR), are each reported, and the exit status is 1.
// The chunks are all checked, not only up to the first mismatch.

// RUN: not attnfuse-opt %S/Inputs/expected_mismatch.mlir --split-input-file --verify-diagnostics 2>&1 >/dev/null | filecheck %s

// CHECK:      expected_mismatch.mlir:6:3: error: unexpected error: attn.qk q heads (4) must be a multiple of k heads (3)
// CHECK-NEXT: expected_mismatch.mlir:5:6: error: expected error "head dims differ" was not produced
// CHECK-NEXT: expected_mismatch.mlir:14:6: error: expected error "cap must be > 0" was not produced
// CHECK-NEXT: expected_mismatch.mlir:23:3: error: unexpected error: attn.softcap cap must be > 0 and finite, got -1.0
// CHECK-NEXT: expected_mismatch.mlir:32:3: error: unexpected error: attn.qk q heads (4) must be a multiple of k heads (3)
// CHECK-NEXT: expected_mismatch.mlir:31:6: error: expected error "must be a multiple of k heads" was not produced
// CHECK-EMPTY:

