// Malformed IR and bad options get a one-message diagnostic on stderr and a
// non-zero exit status (lit's `not` checks it), never a Python traceback.

// RUN: not attnfuse-opt %S/Inputs/syntax_error.mlir 2>&1 | filecheck %s --check-prefix=SYNTAX
// SYNTAX-NOT:  Traceback
// SYNTAX:      attnfuse-opt: error: {{.*}}syntax_error.mlir:2:32
// SYNTAX-NEXT:   %r = attn.rope %q half theta 10000.0 rotary_dim = 64 : tensor<?x8x?x64xf32>
// SYNTAX-NEXT:                                ^^^^^^^
// SYNTAX-NEXT:                                Expected '='
// SYNTAX-NOT:  Traceback

// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir 2>&1 | filecheck %s --check-prefix=VERIFY
// VERIFY-NOT:  Traceback
// VERIFY:      attnfuse-opt: error: attn.qk q heads (8) must be a multiple of k heads (3)
// VERIFY:      %s = "attn.qk"(%q, %k) : (tensor<?x8x?x64xf32>, tensor<?x3x?x64xf32>) -> !attn.scores<8>
// VERIFY-NEXT: ^^^^^^^^^^^^^^
// VERIFY-NOT:  Traceback

// RUN: not attnfuse-opt %S/Inputs/unknown_op.mlir 2>&1 | filecheck %s --check-prefix=UNKNOWN
// UNKNOWN-NOT: Traceback
// UNKNOWN:     attnfuse-opt: error: {{.*}}unknown_op.mlir:2:
// UNKNOWN:     Operation attn.dropout is not registered
// UNKNOWN-NOT: Traceback

// RUN: not attnfuse-opt %S/Inputs/bad_scaling_attr.mlir 2>&1 | filecheck %s --check-prefix=SCALING
// SCALING-NOT: Traceback
// SCALING:     attnfuse-opt: error: "llama3" should be of base attribute attn.rope_scaling
// SCALING:     "attn.rope"(%q)
// SCALING-NOT: Traceback

// RUN: not attnfuse-opt %S/Inputs/bad_scaling_kind.mlir 2>&1 | filecheck %s --check-prefix=KIND
// KIND-NOT:    Traceback
// KIND:        attnfuse-opt: error: unknown rope scaling 'dynamic_ntk', expected one of linear, llama3, yarn
// KIND-NOT:    Traceback

// Unknown passes, pass options and targets, and malformed pass pipelines, are one
// line naming the pipeline text and what is wrong in it.
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -p no-such-pass 2>&1 | filecheck %s --check-prefix=PASS
// PASS:        attnfuse-opt: error: pass pipeline 'no-such-pass': unknown pass 'no-such-pass' (--help lists the passes)
// PASS-EMPTY:
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -p 'canonicalize{no-such-option=1}' 2>&1 | filecheck %s --check-prefix=OPTION
// OPTION:      attnfuse-opt: error: pass pipeline 'canonicalize{no-such-option=1}': pass 'canonicalize': Provided arguments ["no_such_option"] not found
// OPTION-EMPTY:
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -p 'tiling{block-m=abc}' 2>&1 | filecheck %s --check-prefix=VALUE
// VALUE:       attnfuse-opt: error: pass pipeline 'tiling{block-m=abc}': pass 'tiling': Incompatible types: given ('abc',), expected int | None
// VALUE-EMPTY:
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -p 'tiling{block-m=64' 2>&1 | filecheck %s --check-prefix=BRACE
// BRACE:       attnfuse-opt: error: pass pipeline 'tiling{block-m=64': column 18: Malformed pass arguments, expected either a space or `}` here
// BRACE-EMPTY:
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -p ',' 2>&1 | filecheck %s --check-prefix=COMMA
// COMMA:       attnfuse-opt: error: pass pipeline ',': column 1: Expected pass name here
// COMMA-EMPTY:
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -p 'tiling,,causal-split' 2>&1 | filecheck %s --check-prefix=COMMAS
// COMMAS:      attnfuse-opt: error: pass pipeline 'tiling,,causal-split': column 8: Expected pass name here
// COMMAS-EMPTY:
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -t no-such-target 2>&1 | filecheck %s --check-prefix=TARGET
// TARGET:      attnfuse-opt: error: argument -t/--target: invalid choice: 'no-such-target'
// TARGET-NOT:  Traceback
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -t 'mlir{' 2>&1 | filecheck %s --check-prefix=TARGETSPEC
// TARGETSPEC:  attnfuse-opt: error: target 'mlir{': column 6: Expected argument name here
// TARGETSPEC-EMPTY:
// RUN: not attnfuse-opt %S/Inputs/verify_error.mlir -t 'triton{no-such-option=1}' 2>&1 | filecheck %s --check-prefix=TARGETOPTION
// TARGETOPTION: attnfuse-opt: error: target 'triton{no-such-option=1}': Provided arguments ["no_such_option"] not found
// TARGETOPTION-EMPTY:

// Input that is not UTF-8 text.
// RUN: printf '\377\376garbage' > %t.bin.mlir
// RUN: not attnfuse-opt %t.bin.mlir 2>&1 | filecheck %s --check-prefix=BINARY
// BINARY:      attnfuse-opt: error: {{.*}}.bin.mlir is not UTF-8 text: 'utf-8' codec can't decode byte 0xff in position 0
// BINARY-EMPTY:

// Input nested deeper than Python's recursion limit (2000 regions) is one line too,
// not thousands of lines of RecursionError.
// RUN: python %S/Inputs/deep_nesting.py > %t.mlir
// RUN: not attnfuse-opt %t.mlir --allow-unregistered-dialect 2>&1 | filecheck %s --check-prefix=DEEP
// DEEP:        attnfuse-opt: error: the input is nested too deeply (Python's recursion limit, {{[0-9]+}}, was reached)
// DEEP-EMPTY:
