"""Writes the argv and environment it received to $RECORD_FILE (for the quoting tests)."""
import json
import os
import sys

names = json.loads(os.environ.get("RECORD_ENV_NAMES", "[]"))
with open(os.environ["RECORD_FILE"], "w", encoding="utf-8") as fh:
    json.dump({"argv": sys.argv[1:], "env": {n: os.environ.get(n) for n in names}}, fh)
