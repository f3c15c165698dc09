// RUN: attnfuse-opt %s -t triton | filecheck %s

// A tl.device_fn prints as a @triton.jit function returning its values; tl.gluon_attention as a
// call of the Gluon library with its score functions, their arguments, the sink and Q's
// transforms.
tl.device_fn @score(%s: !tl.tile<f32>, %qi: !tl.tile<i32>, %ki: !tl.tile<i32>, %off: i32, %w: !tl.ptr<f32>, %sw: i32) {
  %keep = tl.cmp "<=" %ki, %qi : !tl.tile<i32>, !tl.tile<i32> -> !tl.tile<i1>
  %ninf = tl.constant 0xff800000 : f32
  %m = tl.where %keep, %s, %ninf : !tl.tile<i1>, !tl.tile<f32>, f32 -> !tl.tile<f32>
  tl.return %m : !tl.tile<f32>
}
tl.device_fn @kv_range(%lo: i32, %hi: i32, %n: i32) {
  %z = tl.constant 0 : i32
  tl.return %z, %z, %lo, %hi : i32, i32, i32, i32
}
tl.launcher "launch"(["q", "k", "v", "w", "sk", "cos", "sin"]) {
  tl.alloc "out" shape ["q.shape[0]"] dtype "torch.bfloat16" device "q.device"
  tl.alloc "lse" shape ["q.shape[0]"] dtype "torch.float32" device "q.device"
  tl.gluon_attention "q", "k", "v" -> "out", "lse" scale 1.250000e-01 sink "sk" range @kv_range masked @score natural args ["w", "w.stride(0)"] rope ["cos", "sin", "p.shape[1]"] q_norm 1.000000e-06 q_norm_weight "w"
  tl.host_return ["out", "lse"]
}
// CHECK:       def score(s, qi, ki, off, w, sw):
// CHECK-NEXT:      keep = ki <= qi
// CHECK-NEXT:      m = tl.where(keep, s, float("-inf"))
// CHECK-NEXT:      return m
// CHECK:       @triton.jit
// CHECK-NEXT:  def kv_range(lo, hi, n):
// CHECK-NEXT:      return 0, 0, lo, hi
// CHECK:       def launch(q, k, v, w, sk, cos, sin):
// CHECK:           _gluon_attention(q, k, v, out, lse, 0.125, causal=False, sink=sk, hooks=(kv_range, None, score), xargs=(w, w.stride(0),), natural=True, rope=(cos, sin, p.shape[1]), q_norm=(w, 1e-06))
