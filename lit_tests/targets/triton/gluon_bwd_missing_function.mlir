// RUN: not attnfuse-opt %s -t triton 2>&1 | filecheck %s

// The Gluon backward's functions must be the module's too.
tl.device_fn @range(%lo: i32, %hi: i32, %n: i32) {
  tl.return %lo, %lo, %hi, %hi : i32, i32, i32, i32
}
tl.launcher "launch"(["q", "k", "v", "out", "lse", "dout"]) {
  tl.alloc "dq_acc" shape ["q.shape[0]"] dtype "torch.float32" device "q.device"
  tl.gluon_backward "q", "k", "v", "dout", "lse", "delta" -> "dq_acc", "dk", "dv" scale 1.000000e+00 range @range kv_range @range full @missing masked @range
  tl.host_return ["dq_acc"]
}
// CHECK-NOT:   @triton.jit
// CHECK: error: tl.gluon_backward calls @missing, which is not a tl.device_fn of the module
