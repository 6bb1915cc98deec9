"""`python -m attnlab.exercises ID FILE`: one check, its verdict as one JSON line on stdout (the child
process of attnlab.exercises.registry.check(..., isolate=True); readers use `python -m attnlab exercises`)."""
import json
import sys

from .registry import check

if len(sys.argv) != 3:
    print("usage: python -m attnlab.exercises ID FILE", file=sys.stderr)
    sys.exit(2)
print(json.dumps(check(sys.argv[1], sys.argv[2]).to_dict()))
