// Verification includes SSA dominance, which xDSL 0.74's verifier does not check: a
// value used where its definition does not dominate the use is an error naming the
// op, the value and their lines, not IR that lowers into a kernel reading the value
// before it is computed.

// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics | filecheck %s

// The valid chunks are printed.
// CHECK: func.func @defined_in_entry
// CHECK: func.func @loop_body_reads_outer_value

// Through the whole pipeline to Triton: the same diagnostic, before any pass runs.
// RUN: not attnfuse-opt %S/Inputs/use_before_def.mlir -p 'attnfuse-pipeline{sm=0}' -t triton 2>&1 | filecheck %s --check-prefix=PIPELINE
// PIPELINE:     attnfuse-opt: error: attn.pv at {{.*}}use_before_def.mlir:4:3 uses %p (operand #0) before its definition (defined by attn.softmax at {{.*}}use_before_def.mlir:5:3)
// PIPELINE-NOT: triton.jit

func.func @attn_use_before_def(%q: tensor<?x4x?x16xf32>, %k: tensor<?x4x?x16xf32>, %v: tensor<?x4x?x16xf32>) -> tensor<?x4x?x16xf32> {
  %s = attn.qk %q, %k : tensor<?x4x?x16xf32>, tensor<?x4x?x16xf32> -> !attn.scores<4>
  // expected-error@+1 {{attn.pv at}}
  %o = attn.pv %p, %v : !attn.probs<4>, tensor<?x4x?x16xf32> -> tensor<?x4x?x16xf32>
  %p = attn.softmax %s : !attn.scores<4> -> !attn.probs<4>
  func.return %o : tensor<?x4x?x16xf32>
}

// -----

// A use inside a region, of a value defined after the region's op.
func.func @region_reads_later_value(%s: !attn.scores<4>) {
  %t = attn.score_mod %s {
  ^bb0(%x: f32, %b: i32, %h: i32, %qi: i32, %ki: i32):
    // expected-error@+1 {{arith.addf at}}
    %y = arith.addf %x, %z : f32
    attn.yield %y : f32
  } : !attn.scores<4>
  %z = arith.constant 1.0 : f32
  func.return
}

// -----

func.func @own_result() -> i32 {
  // expected-error@+1 {{uses %x (operand #0), which is its own result}}
  %x = arith.addi %x, %x : i32
  func.return %x : i32
}

// -----

// Across blocks: ^a does not dominate ^c, which ^b also reaches.
func.func @not_dominating_block(%c: i1) -> i32 {
  cf.cond_br %c, ^a, ^b
^a:
  %x = arith.constant 1 : i32
  cf.br ^c
^b:
  cf.br ^c
^c:
  // expected-error@+1 {{uses %x (operand #0) in a block that its definition does not dominate}}
  func.return %x : i32
}

// -----

// A block argument is usable only in the blocks its block dominates.
func.func @block_argument(%c: i1) -> i32 {
  %x = arith.constant 1 : i32
  cf.cond_br %c, ^a(%x : i32), ^b
^a(%y: i32):
  cf.br ^c
^b:
  cf.br ^c
^c:
  // expected-error@+1 {{uses %y (operand #0) in a block that its definition does not dominate}}
  func.return %y : i32
}

// -----

// Valid: the entry block dominates every block.
func.func @defined_in_entry(%c: i1) -> i32 {
  %x = arith.constant 1 : i32
  cf.cond_br %c, ^a, ^b
^a:
  cf.br ^c(%x : i32)
^b:
  cf.br ^c(%x : i32)
^c(%y: i32):
  func.return %y : i32
}

// -----

// Valid: a loop body reads a value defined before the loop.
func.func @loop_body_reads_outer_value(%n: index) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %f = arith.constant 1.0 : f32
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %f) -> (f32) {
    %a = arith.addf %acc, %f : f32
    scf.yield %a : f32
  }
  func.return %r : f32
}
