// Annotations that the errors do not meet, for verify_diagnostics_mismatch.mlir.

// A different message on the erroring line.
func.func @wrong_message(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  // expected-error@+1 {{head dims differ}}
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4>
  func.return
}

// -----

// An error that is never produced: the IR is valid.
func.func @no_error(%s: !attn.scores<4>) {
  // expected-error@+1 {{cap must be > 0}}
  %c = attn.softcap %s cap = 20.0 : !attn.scores<4>
  func.return
}

// -----

// An error that no annotation expects.
func.func @unexpected(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = -1.0 : !attn.scores<4>
  func.return
}

// -----

// The right message on the wrong line.
func.func @wrong_line(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  // expected-error@+2 {{must be a multiple of k heads}}
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4>
  func.return
}

// -----

// This one is met.
func.func @met(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4> // expected-error {{must be a multiple of k heads}}
  func.return
}
