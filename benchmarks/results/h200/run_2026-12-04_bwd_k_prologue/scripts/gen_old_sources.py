import sys, runpy
sys.path.insert(0, "/tmp")
import oldfinder
sys.meta_path.insert(0, oldfinder._EditableFinder)
import attnfuse, attnfuse.passes
print(attnfuse.__file__, attnfuse.passes.__file__, file=sys.stderr)
sys.argv = ["gen", "old", "/work/main/abwork"]
runpy.run_path("/tmp/gen_ab.py", run_name="__main__")
