"""Issue 54, files: migrate keeps the script's bytes, permissions and earlier backups safe, reads it as Python
does, says where a parse fails as Python says it, and a --check ended from outside ends what it started."""
from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp.cli import cli

from .conftest import ROOT, SCRIPTS, cli_runner

DP = (SCRIPTS / "migrate" / "dp_train.py").read_text()


def migrate(*argv: str):
    return cli_runner().invoke(cli, ["migrate", *argv])


def test_crlf_line_ends_and_the_original_s_permissions_are_kept(tmp_path):
    script = tmp_path / "train.py"
    script.write_bytes(DP.replace("\n", "\r\n").encode())
    script.chmod(0o700)  # private and executable
    got = migrate(str(script))
    assert got.exit_code == 0, got.stderr
    out = (tmp_path / "train_ddp.py").read_bytes()
    assert b"runtime.wrap(" in out and out.count(b"\r\n") == out.count(b"\n"), out[:200]
    assert stat.S_IMODE((tmp_path / "train_ddp.py").stat().st_mode) == 0o700
    before = script.read_bytes()
    again = migrate(str(script), "--in-place")
    assert again.exit_code == 0, again.stderr
    kept = tmp_path / "train.py.orig"
    assert kept.read_bytes() == before and stat.S_IMODE(kept.stat().st_mode) == 0o700
    assert stat.S_IMODE(script.stat().st_mode) == 0o700 and script.read_bytes() == out


def test_in_place_never_replaces_an_earlier_backup_and_says_where_this_one_is(tmp_path):
    script = tmp_path / "train.py"
    (tmp_path / "train.py.orig").write_text("# someone's earlier original\n")
    script.write_text(DP)
    got = migrate(str(script), "--in-place")
    assert got.exit_code == 0, got.stderr
    assert (tmp_path / "train.py.orig").read_text() == "# someone's earlier original\n"
    assert (tmp_path / "train.py.orig.1").read_text() == DP
    assert f"the original is kept as {tmp_path / 'train.py.orig.1'}" in got.stderr
    # the same bytes again (a second in-place run after restoring): the existing backup is the one named
    script.write_text(DP)
    again = migrate(str(script), "--in-place")
    assert f"the original is kept as {tmp_path / 'train.py.orig.1'}" in again.stderr
    assert not (tmp_path / "train.py.orig.2").exists()


def test_a_pep_263_latin_1_script_is_read_and_written_in_its_encoding(tmp_path):
    script = tmp_path / "l1.py"
    script.write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + DP.encode())
    got = migrate(str(script))
    assert got.exit_code == 0, got.stderr
    out = (tmp_path / "l1_ddp.py").read_bytes()
    assert out.startswith(b"# -*- coding: latin-1 -*-\n# caf\xe9\n") and b"runtime.wrap(" in out
    compile(out, "l1_ddp.py", "exec")  # Python reads it back


@pytest.mark.parametrize("source, where, said", [
    # LibCST named line 6 (where it gave up); Python names the bracket never closed
    ("import torch.nn as nn\nm = nn.DataParallel(x)\nf(1,\ny = 2\nz = 3\n\nq = 4\n", ":3:", "never closed"),
    ("import torch.nn as nn\nm = nn.DataParallel(x)\nif m:\nprint(2)\n", ":4:", "expected an indented block"),
])
def test_a_parse_error_names_the_line_python_names(tmp_path, source, where, said):
    script = tmp_path / "bad.py"
    script.write_text(source)
    got = migrate(str(script))
    assert got.exit_code == 2 and f"bad.py{where}" in got.stderr and said in got.stderr, got.stderr
    assert "Traceback" not in got.stderr and not (tmp_path / "bad_ddp.py").exists()


def test_nesting_too_deep_for_the_rewrite_is_one_line_not_a_traceback(tmp_path):
    script = tmp_path / "deep.py"
    script.write_text("import torch.nn as nn\nm = nn.DataParallel(x)\ny = " + " + ".join(["a"] * 5000) + "\n")
    got = migrate(str(script))
    assert got.exit_code == 1 and "nested too deeply" in got.stderr and "Traceback" not in got.stderr, got.stderr
    assert not (tmp_path / "deep_ddp.py").exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.ranks
def test_an_edited_copy_is_checked_and_a_check_ended_by_sigterm_ends_its_ranks(tmp_path):
    """``migrate X_ddp.py --check`` checks the copy as it is (it said "left alone" and exited 0 unchecked); a
    SIGTERM to migrate (a `timeout`, a CI limit) ends the local job it started and its 4 ranks."""
    copy = _edited_copy(tmp_path, "time.sleep(0.5)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "clusterddp", "migrate", str(copy), "--check", "--check-steps",
                             "200", "--", "--epochs", "50"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    pids: list = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(pids) < 4:
        pids = _ranks_of(proc.pid)
        time.sleep(0.5)
    assert len(pids) >= 4, f"the check's ranks did not start: {pids}"
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    assert "checking" in out and "train_ddp.py as it is" in out, out
    assert proc.returncode == 1 and "ended by SIGTERM" in out and "Traceback" not in out, out
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], "ranks outlived the check"


def _edited_copy(where: Path, after_each_step: str) -> Path:
    """dp_train.py migrated, then edited by hand as a user would (a line after each step): DDP already."""
    script = where / "train.py"
    script.write_text(DP)
    assert migrate(str(script)).exit_code == 0
    copy = where / "train_ddp.py"
    text = copy.read_text()
    assert "            runtime.step()\n" in text
    step = "            runtime.step()\n"
    copy.write_text(text.replace("import torch\n", "import time\nimport torch\n", 1)
                    .replace(step, f"{step}            {after_each_step}\n"))
    return copy


@pytest.mark.ranks
def test_a_check_whose_ranks_hang_gives_its_verdict_within_its_hang_limit(tmp_path):
    """Issue 54: on a hang (here rank 3 stops in epoch 1 while the others wait in its all-reduce) --check gave no
    verdict for 150 s; now the job is ended after --check-hang seconds without progress and the verdict says so."""
    copy = _edited_copy(tmp_path, "if runtime.rank() == 3 and epoch == 1: time.sleep(3600)")
    started = time.monotonic()
    got = subprocess.run([sys.executable, "-m", "clusterddp", "migrate", str(copy), "--check", "--check-hang", "10",
                          "--", "--epochs", "3"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         text=True, capture_output=True, timeout=240)
    took = time.monotonic() - started
    assert got.returncode == 1 and "check: hung: no rank advanced for 10 s" in got.stderr, got.stderr
    assert "Traceback" not in got.stderr.split("check: hung")[-1]
    said = next(line for line in got.stderr.splitlines() if "check: hung" in line)
    assert re.search(r"steps each rank had ended: rank 0 \d+, rank 1 \d+, rank 2 \d+, rank 3 \d+", said), said
    print(said)
    print(f"verdict after {took:.1f} s")  # (10 s limit: the ranks' start, epoch 0, then 10 s of no progress)


def _ranks_of(root: int) -> list:
    """The python processes below ``root`` that run the checked script (its ranks), by /proc."""
    children: dict = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().split(")")[-1].split()[1])
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append((int(entry.name), cmd))
    found, todo = [], [root]
    while todo:
        for pid, cmd in children.get(todo.pop(), []):
            todo.append(pid)
            if any(part.endswith(b"train_ddp.py") for part in cmd):
                found.append(pid)
    return found

