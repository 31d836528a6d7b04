"""Issue 23, class 15: logs are scanned as a stream (a 1.2 GB log was a MemoryError), links are not followed, and
what is shown of them goes through the printable filter."""
from __future__ import annotations

import os
import subprocess
import sys

from clusterddp.healing.logscan import summary, tracebacks

from .conftest import ROOT

TRACE = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
         "ValueError: bad \x1b]0;title\x07 value\n")


def test_a_huge_log_is_scanned_in_little_memory(tmp_path):
    log = tmp_path / "node-0.out"
    with open(log, "wb") as f:
        f.truncate(400 << 20)  # 400 MB of one line (sparse: no disk), then the traceback
        f.seek(0, 2)
        f.write(("\n[default1]:" + TRACE.replace("\n", "\n[default1]:")).encode())
    code = ("from pathlib import Path; from clusterddp.healing.logscan import tracebacks\n"
            f"found = tracebacks([Path({str(log)!r})])\n"
            "print(len(found), found[0].label, found[0].last)\n"
            # VmHWM: this process's own peak (ru_maxrss would carry the forking pytest's size across exec)
            "print(int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    first, peak = proc.stdout.splitlines()
    assert first.startswith("1 node-0.out local rank 1 ValueError: bad"), first
    assert int(peak) < 200, f"peak {peak} MB for a 400 MB log"


def test_a_linked_log_is_not_read_and_what_is_shown_is_printable(tmp_path):
    secret = tmp_path / "id_ed25519"
    secret.write_text(TRACE)
    os.symlink(secret, tmp_path / "rank-0.out")
    assert tracebacks([tmp_path / "rank-0.out"]) == []
    (tmp_path / "rank-1.out").write_text("ok\n" + TRACE)
    text = summary(tracebacks([tmp_path / "rank-1.out"]), "the logs")
    assert "ValueError: bad ?]0;title? value" in text and "\x1b" not in text


def test_a_traceback_counts_only_as_its_writer_s_last_words(tmp_path):
    """Issue 39: a traceback the program printed and handled (then went on for hours) is not why it died; the last
    one is, however long, prefixed by torch ("[rank0]: ") or chained."""
    handled = tmp_path / "rank-0.out"
    handled.write_text(TRACE + "".join(f"step {i} loss 0.5\n" for i in range(200)))
    assert tracebacks([handled]) == []
    deep = "".join(f"  File \"model.py\", line {i}, in forward\n    x = self.layer(x)\n" for i in range(120))
    ended = tmp_path / "rank-1.out"
    ended.write_text(TRACE + "step 1\nstep 2\nDuring handling of the above exception, another exception occurred:\n\n"
                     + "".join(f"[rank1]: {line}\n" for line in (f"Traceback (most recent call last):\n{deep}"
                                                             "RuntimeError: shapes differ").splitlines())
                     + "[rank1]:[W1203] ProcessGroupGloo: destroy_process_group() was not called\n")
    (found,) = tracebacks([handled, ended])
    assert found.label == "rank-1.out" and found.last == "[rank1]: RuntimeError: shapes differ", found.last
