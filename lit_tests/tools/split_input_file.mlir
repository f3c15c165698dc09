// --split-input-file processes every chunk, as mlir-opt does: a failing chunk is
// reported on stderr and the next chunks are still processed; the exit status is 1
// because a chunk failed. The chunks that succeed are printed, in order, with the
// separator between every two chunks.

// RUN: not attnfuse-opt %s --split-input-file > %t.out 2> %t.err
// RUN: filecheck %s --check-prefix=OUT < %t.out
// RUN: filecheck %s --check-prefix=ERR < %t.err

// (The separator is matched as `// {{-----}}`: spelt out, it would split this file.)
// OUT:      builtin.module {
// OUT-NEXT:   func.func @first_good
// OUT:      // {{-----}}
// OUT-NEXT: // {{-----}}
// OUT-NEXT: builtin.module {
// OUT-NEXT:   func.func @second_good
// OUT:      // {{-----}}
// OUT-NEXT: // {{-----}}
// OUT-NEXT: builtin.module {
// OUT-NEXT:   func.func @third_good
// OUT-NOT:  error

// ERR:      attnfuse-opt: error: attn.softcap cap must be > 0 and finite, got -1.0
// ERR:      attnfuse-opt: error: {{.*}}split_input_file.mlir:50:28
// ERR:      Expected '='
// ERR-NOT:  Traceback

func.func @first_good(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = 20.0 : !attn.scores<4>
  func.return
}

// -----

func.func @bad_verify(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = -1.0 : !attn.scores<4>
  func.return
}

// -----

func.func @second_good(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = 20.0 : !attn.scores<4>
  func.return
}

// -----

func.func @bad_syntax(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap 20.0 : !attn.scores<4>
  func.return
}

// -----

func.func @third_good(%s: !attn.scores<4>) {
  %c = attn.softcap %s cap = 20.0 : !attn.scores<4>
  func.return
}

// Without --split-input-file the file is one module (the separators are comments),
// and its first error, here the syntax error, fails it all.
// RUN: not attnfuse-opt %s 2>&1 | filecheck %s --check-prefix=WHOLE
// WHOLE:     attnfuse-opt: error: {{.*}}split_input_file.mlir:50:28
// WHOLE-NOT: builtin.module
