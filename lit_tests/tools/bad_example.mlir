// The shipped attnfuse/examples/bad.mlir (the README's --verify-diagnostics line): every chunk
// fails with its annotated error, so the exit status is 0; stripped of its annotations, each
// chunk is an error and the exit status is 1.

// RUN: attnfuse-opt %S/../../attnfuse/examples/bad.mlir --split-input-file --verify-diagnostics | filecheck %s
// RUN: sed -e 's|// expected-error.*||' %S/../../attnfuse/examples/bad.mlir | not attnfuse-opt - --split-input-file 2>&1 | filecheck %s --check-prefix=BARE

// CHECK-NOT: error
// BARE: attnfuse-opt: error: attn.qk q heads (32) must be a multiple of k heads (6)
// BARE: attnfuse-opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}
// BARE: identifier expected: a rope scaling parameter name
// BARE: attnfuse-opt: error: <stdin>:{{[0-9]+}}:{{[0-9]+}}
// BARE: Expected '='
// BARE: attnfuse-opt: error: attn.pv at <stdin>:{{[0-9]+}}:3 uses %p (operand #0) before its definition
