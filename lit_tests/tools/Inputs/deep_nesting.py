"""Print a module whose regions nest 2000 deep (an unregistered op inside itself):
deeper than Python's default recursion limit, which xDSL's parser recurses with."""

DEPTH = 2000
print("func.func @f() {")
print('"test.op"() ({' * DEPTH)
print("}) : () -> ()" * DEPTH)
print("func.return\n}")
