// Packed documents: causal and a document mask from per-token document ids.
builtin.module {
  func.func @packed_documents(%q: tensor<?x8x?x128xbf16>, %k: tensor<?x2x?x128xbf16>, %v: tensor<?x2x?x128xbf16>, %doc_ids: tensor<?x?xi32>) -> tensor<?x8x?x128xbf16> {
    %s = attn.qk %q, %k : tensor<?x8x?x128xbf16>, tensor<?x2x?x128xbf16> -> !attn.scores<8>
    %s_1 = attn.mask %s causal : !attn.scores<8>
    %s_2 = attn.mask %s_1 document(%doc_ids : tensor<?x?xi32>) : !attn.scores<8>
    %p = attn.softmax %s_2 : !attn.scores<8> -> !attn.probs<8>
    %o = attn.pv %p, %v : !attn.probs<8>, tensor<?x2x?x128xbf16> -> tensor<?x8x?x128xbf16>
    func.return %o : tensor<?x8x?x128xbf16>
  }
}
