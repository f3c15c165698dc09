// RUN: not attnfuse-opt %s -t triton 2>&1 | filecheck %s

// A call of a function the module does not define is an error, not a NameError at launch.
tl.launcher "launch"(["q", "k", "v"]) {
  tl.alloc "out" shape ["q.shape[0]"] dtype "torch.bfloat16" device "q.device"
  tl.alloc "lse" shape ["q.shape[0]"] dtype "torch.float32" device "q.device"
  tl.gluon_attention "q", "k", "v" -> "out", "lse" scale 1.000000e+00 range @missing masked @missing
  tl.host_return ["out", "lse"]
}
// CHECK-NOT:   @triton.jit
// CHECK: error: tl.gluon_attention calls @missing, which is not a tl.device_fn of the module
