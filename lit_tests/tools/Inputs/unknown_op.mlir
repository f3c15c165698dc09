func.func @f(%s: !attn.scores<8>) {
  %m = attn.dropout %s : !attn.scores<8>
  func.return
}
