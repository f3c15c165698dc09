// RUN: not attnfuse-opt %s -t triton 2>&1 | filecheck %s

// One foreign op inside an otherwise valid tl kernel is reported by name.

tl.kernel @k(%x: !tl.ptr<f32>) {
  %c = arith.constant 1.0 : f32
  tl.store %c, %x : f32, !tl.ptr<f32>
  tl.return
}

// CHECK-NOT:   @triton.jit
// CHECK:       attnfuse-opt: error: the triton target prints only tl ops, found 'arith.constant'
