// --verify-diagnostics checks `expected-error` annotations as mlir-opt does: every
// chunk's error matches an annotation on its line (a substring of the message), and
// every annotation is met. Here all of them are, so the exit status is 0; the chunks
// that succeed are printed.

// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics | filecheck %s

// (The chunk separator is spelt {{[-]+}} below, lest it split this file.)
// CHECK:      builtin.module {
// CHECK-NEXT:   func.func @fine
// CHECK:      {{^}}// {{-----}}
// CHECK-NEXT: {{^}}// {{-----}}
// CHECK-NEXT: {{^}}// {{-----}}
// CHECK-NEXT: {{^}}// {{-----}}
// CHECK-NEXT: {{^}}// {{-----}}
// CHECK-NEXT: {{^}}// {{-----}}
// CHECK-NEXT: {{^}}// {{-----}}
// CHECK-NEXT: {{^}}// {{-----}}
// CHECK-NEXT: {{^}}// {{-----}}
// CHECK-NEXT: builtin.module {
// CHECK-NEXT:   func.func @also_fine
// CHECK-NOT:  error

func.func @fine(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = 20.0 : !attn.scores<4>
  func.return
}

// -----

// On the annotation's own line.
func.func @same_line(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4> // expected-error {{q heads (4) must be a multiple of k heads (3)}}
  func.return
}

// -----

// @+N: N lines below.
func.func @below(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  // expected-error@+1 {{attn.qk q heads (4) must be a multiple of k heads (3)}}
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4>
  func.return
}

// -----

// @-N: N lines above.
func.func @above(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4>
  // expected-error@-1 {{must be a multiple of k heads}}
  func.return
}

// -----

// @above and @below: the nearest line that holds no annotation.
func.func @above_below(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  // expected-error@below {{must be a multiple of k heads}}
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4>
  func.return
}

// -----

func.func @above_keyword(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4>
  // expected-error@above {{must be a multiple of k heads}}
  func.return
}

// -----

// -re: the {{...}} parts inside the message are regular expressions.
func.func @regex(%q: tensor<?x4x?x16xf32>, %k: tensor<?x3x?x16xf32>) {
  // expected-error-re@+1 {{q heads ({{[0-9]+}}) must be a multiple of k heads ({{[0-9]+}})}}
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x3x?x16xf32> -> !attn.scores<4>
  func.return
}

// -----

// Syntax errors are matched at their own line.
func.func @syntax(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap 20.0 : !attn.scores<4> // expected-error {{Expected '='}}
  func.return
}

// -----

// A value used before its definition (dominance).
func.func @use_before_def(%q: tensor<?x4x?x16xf32>, %k: tensor<?x4x?x16xf32>, %v: tensor<?x4x?x16xf32>) -> tensor<?x4x?x16xf32> {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x4x?x16xf32> -> !attn.scores<4>
  // expected-error@+1 {{uses %p (operand #0) before its definition (defined by attn.softmax at}}
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x16xf32> -> tensor<?x4x?x16xf32>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  func.return %o : tensor<?x4x?x16xf32>
}

// -----

func.func @also_fine(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = 20.0 : !attn.scores<4>
  func.return
}
