// RUN: attnfuse-opt %s -p 'rope-fusion,causal-split,tiling{sm=0},convert-attn-to-tl' | filecheck %s
// RUN: attnfuse-opt %s -p 'rope-fusion,causal-split,tiling{sm=0},convert-attn-to-tl' | filecheck %s --check-prefix=ONE-LOOP

// Masks causal-split cannot bound (document ids, custom regions) give one KV loop over
// every block, all masked. The document ids are extra kernel parameters (pointer and
// strides); the query's id is loaded once in the prologue, the keys' in the loop. The
// region's arith ops become tile expressions, its attn.extract a masked load; all
// predicates are and-ed into one `keep` applied after the score ops.

func.func @document(%q: tensor<?x2x?x16xf16>, %k: tensor<?x2x?x16xf16>, %v: tensor<?x2x?x16xf16>, %ids: tensor<?x?xi32>, %t: tensor<?xi32>) -> tensor<?x2x?x16xf16> {
  %s = attn.qk %q, %k : tensor<?x2x?x16xf16>, tensor<?x2x?x16xf16> -> !attn.scores<2>
  %d = attn.mask %s document(%ids : tensor<?x?xi32>) : !attn.scores<2>
  %m = attn.mask %d custom(%t : tensor<?xi32>) {
  ^bb0(%b: i32, %h: i32, %qi: i32, %ki: i32, %tt: tensor<?xi32>):
    %c3 = arith.constant 3 : i32
    %r = arith.remsi %ki, %c3 : i32
    %z = arith.constant 0 : i32
    %ne = arith.cmpi ne, %r, %z : i32
    %tv = attn.extract %tt[%ki] : tensor<?xi32>
    %pos = arith.cmpi sgt, %tv, %z : i32
    %or = arith.ori %ne, %pos : i1
    attn.yield %or : i1
  } : !attn.scores<2>
  %p = attn.softmax %m : !attn.scores<2> -> !attn.probs<2>
  %o = attn.pv %p, %v : !attn.probs<2>, tensor<?x2x?x16xf16> -> tensor<?x2x?x16xf16>
  func.return %o : tensor<?x2x?x16xf16>
}

// CHECK:         tl.kernel @attn_fwd({{.*}}, %BLOCK_M: i32 constexpr, %BLOCK_N: i32 constexpr, %ids: !tl.ptr<i32>, %stride_ids: i32, %stride_ids_1: i32, %t: !tl.ptr<i32>, %stride_t: i32, %size_t: i32) {
// CHECK:           %doc_q = tl.load %{{.*}} mask %row_ok : !tl.tile<i1> {other = -1 : i32} : !tl.tile<!tl.ptr<i32>> -> !tl.tile<i32>
// CHECK:           %[[M:.*]], %[[L:.*]], %[[A:.*]] = tl.for %start_n = %[[ZERO:.*]] to %NK step %BLOCK_N iter_args(%m_i_2 = %m_i, %l_i_2 = %l_i, %acc_2 = %acc)
// CHECK:             %kv_ok = tl.cmp "<" %offs_n, %NK
// CHECK:             %doc_k = tl.load %{{.*}} mask %{{.*}} {other = -2 : i32}
// CHECK-NEXT:        %same_doc = tl.cmp "==" %{{.*}}, %doc_k
// The region: kv_idx % 3 != 0 | t[kv_idx] > 0.
// CHECK:             %[[REM:.*]] = tl.rem %{{.*}}, %{{.*}} : !tl.tile<i32>, i32 -> !tl.tile<i32>
// CHECK:             %[[NE:.*]] = tl.cmp "!=" %[[REM]], %{{.*}} : !tl.tile<i32>, i32 -> !tl.tile<i1>
// t is indexed at int64 offsets, the load masked to t's bounds (outside: 0) and the valid pairs.
// CHECK:             %[[LO:.*]] = tl.cmp ">=" %[[KV:.*]], %{{.*}} : !tl.tile<i32>, i32 -> !tl.tile<i1>
// CHECK-NEXT:        %[[HI:.*]] = tl.cmp "<" %[[KV]], %size_t : !tl.tile<i32>, i32 -> !tl.tile<i1>
// CHECK-NEXT:        %[[IN:.*]] = tl.and %[[LO]], %[[HI]]
// CHECK-NEXT:        %[[KV64:.*]] = tl.cast %[[KV]] : !tl.tile<i32> -> !tl.tile<i64>
// CHECK-NEXT:        %[[OFF:.*]] = tl.mul %[[KV64]], %stride_t : !tl.tile<i64>, i32 -> !tl.tile<i64>
// CHECK-NEXT:        %[[PTR:.*]] = tl.add %t, %[[OFF]]
// CHECK-NEXT:        %[[OK:.*]] = tl.and %{{.*}}, %[[IN]]
// CHECK-NEXT:        %[[T:.*]] = tl.load %[[PTR]] mask %[[OK]] : !tl.tile<i1> {other = 0 : i32} : !tl.tile<!tl.ptr<i32>> -> !tl.tile<i32>
// CHECK-NEXT:        %[[GT:.*]] = tl.cmp ">" %[[T]], %{{.*}} : !tl.tile<i32>, i32 -> !tl.tile<i1>
// CHECK-NEXT:        %[[OR:.*]] = tl.or %[[NE]], %[[GT]]
// CHECK-NEXT:        %keep = tl.and %same_doc, %[[OR]]
// CHECK:             %s_masked = tl.where %keep, %qk{{(_[0-9]+)?}},
// CHECK:             tl.yield
// CHECK-NEXT:      }
// CHECK:           tl.return

// ONE-LOOP-COUNT-1: tl.for
// ONE-LOOP-NOT:     tl.for

// The launcher passes the extra tensors with their strides.
// CHECK:         tl.launcher "launch"(["q", "k", "v", "ids", "t"]) {
// CHECK:           tl.call "attn_fwd" grid {{.*}} args [{{.*}}, "32", "32", "ids", "ids.stride(0)", "ids.stride(1)", "t", "t.stride(0)", "t.shape[0]"]
