"""Issue 23, class 3 (checkpoints): a run directory may be shared, so checkpoints load with weights_only=True. What
Checkpointer.save writes (model, optimizer, loader position, every rank's random states) loads that way and
restores exactly; a planted checkpoint that would run code at load is refused in one line, and runs nothing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

ROUNDTRIP = r'''
import random, sys, numpy, torch
from clusterddp import runtime
from clusterddp.errors import RuntimeEnvError
runtime.init(allow_single=True)
ck = runtime.Checkpointer(sys.argv[1])
if sys.argv[2] == "save":
    random.seed(1); torch.manual_seed(2); numpy.random.seed(3)
    random.random(); torch.rand(3); numpy.random.rand(2)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward(); opt.step()
    ck.save(7, model, opt, note="plain data", sizes=[1, 2])
    print("after", random.random(), torch.rand(1).item(), numpy.random.rand())
else:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    try:
        state = ck.load_latest(model, opt)
    except RuntimeEnvError as exc:
        print("refused:", exc)
        sys.exit(3)
    print("step", state["step"], state["extra"])
    print("after", random.random(), torch.rand(1).item(), numpy.random.rand())
runtime.shutdown()
'''


class Evil:
    def __reduce__(self):
        import os
        return (os.system, (f"touch {MARKER}",))


MARKER = ""


def _run(tmp_path, *args):
    script = tmp_path / "ck.py"
    script.write_text(ROUNDTRIP)
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})


@pytest.mark.ranks
def test_what_save_writes_loads_safely_and_exactly(tmp_path):
    saved = _run(tmp_path, str(tmp_path / "ck"), "save")
    assert saved.returncode == 0, saved.stderr
    loaded = _run(tmp_path, str(tmp_path / "ck"), "load")
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert "step 7 {'note': 'plain data', 'sizes': [1, 2]}" in loaded.stdout
    after = lambda out: next(line for line in out.splitlines() if line.startswith("after"))  # noqa: E731
    assert after(loaded.stdout) == after(saved.stdout)  # python, torch and numpy generators continue exactly


@pytest.mark.ranks
def test_a_planted_checkpoint_runs_nothing(tmp_path):
    import torch

    global MARKER
    MARKER = str(tmp_path / "PWNED")
    (tmp_path / "ck").mkdir()
    torch.save({"step": 9, "model": Evil()}, tmp_path / "ck" / "ckpt-0000000009.pt")
    loaded = _run(tmp_path, str(tmp_path / "ck"), "load")
    assert loaded.returncode == 3, loaded.stdout + loaded.stderr
    assert not (tmp_path / "PWNED").exists()
    line = next(x for x in loaded.stdout.splitlines() if x.startswith("refused:"))
    assert "ckpt-0000000009.pt holds more than tensors and plain data, so it was not loaded" in line
    assert "load_latest(..., weights_only=False)" in line and "Traceback" not in loaded.stderr



KEEP = r'''
import os, sys, torch
from clusterddp import runtime
runtime.init(allow_single=True)
try:
    runtime.Checkpointer(sys.argv[1], keep=0)
except ValueError as exc:
    print("refused:", exc)
ck = runtime.Checkpointer(sys.argv[1], keep=2)
model = torch.nn.Linear(2, 2)
for step in (1, 2, 3, 4, 5):
    ck.save(step, model)
    print(step, sorted(os.listdir(sys.argv[1])))
print("latest", ck.load_latest(model)["step"])
runtime.shutdown()
'''


@pytest.mark.ranks
def test_save_keeps_the_last_keep_checkpoints(tmp_path):
    """README: save keeps the last ``keep`` checkpoints (older ones are deleted after a new one is in place)."""
    script = tmp_path / "keep.py"
    script.write_text(KEEP)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "ck")], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "refused: keep must be at least 1, got 0"
    kept = [[f"ckpt-{s:010d}.{e}" for s in range(max(1, step - 1), step + 1) for e in ("json", "pt")]
            for step in (1, 2, 3, 4, 5)]  # after step 5: steps 4 and 5 only, each with its manifest
    assert lines[1:6] == [f"{step} {names}" for step, names in zip((1, 2, 3, 4, 5), kept)]
    assert lines[6] == "latest 5"


@pytest.mark.ranks
def test_a_damaged_newest_checkpoint_is_passed_over_and_stale_temp_files_go(tmp_path):
    """Issue 41: the newest checkpoint cut short (a full disk, a node lost mid-write) no longer fails every restart:
    the older good one loads, with a line saying so; only damaged ones is one clear error. A write killed half-way
    leaves a .tmp-TAG- file: the same run's next start removes it (issue 58: fresh or old), never another run's
    (its write may be in flight), an untagged one, or a link."""
    from clusterddp.runtime import ckptfile

    ck = tmp_path / "ck"
    ck.mkdir()
    mine = f".tmp-{ckptfile.tag(None)}-"  # (outside a job: the run None)
    (ck / f"{mine}killed").write_bytes(b"half a checkpoint")
    (ck / f"{mine}fresh").write_bytes(b"")
    (ck / f".tmp-{ckptfile.tag('another-run')}-inflight").write_bytes(b"")
    (ck / ".tmp-untagged").write_bytes(b"")
    (ck / f"{mine}link").symlink_to(ck / ".tmp-untagged")
    assert _run(tmp_path, str(ck), "save").returncode == 0
    assert sorted(p.name for p in ck.iterdir()) == sorted([
        f".tmp-{ckptfile.tag('another-run')}-inflight", ".tmp-untagged", f"{mine}link", "ckpt-0000000007.json",
        "ckpt-0000000007.pt"])
    good = (ck / "ckpt-0000000007.pt").read_bytes()
    (ck / "ckpt-0000000009.pt").write_bytes(good[: len(good) // 2])   # cut short
    (ck / "ckpt-0000000010.pt").write_bytes(b"not a checkpoint")
    loaded = _run(tmp_path, str(ck), "load")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.splitlines()[-2].startswith("step 7 "), loaded.stdout
    said = loaded.stdout + loaded.stderr
    for step in (9, 10):
        assert f"clusterddp: checkpoint {ck}/ckpt-{step:010d}.pt (" in said, said
    assert f"is damaged and was passed over; loading {ck}/ckpt-0000000007.pt" in said
    (ck / "ckpt-0000000007.pt").write_bytes(good[:100])
    none = _run(tmp_path, str(ck), "load")
    assert none.returncode != 0 and "no checkpoint in" in none.stderr + none.stdout, none.stderr
    assert "every one of them is damaged" in none.stderr + none.stdout


@pytest.mark.ranks
def test_a_checkpoint_that_differs_from_its_manifest_is_passed_over(tmp_path):
    """Issue 41: save writes ckpt-N.json (file, step, size, SHA-256; mode 0600) before the checkpoint takes its name.
    A checkpoint changed after it was written (one byte of its tensor data: still a checkpoint that unpickles) is
    passed over for the older whole one, saying why; one without a manifest (an older clusterddp's) loads as
    before; pruning takes the manifest with its checkpoint."""
    import hashlib
    import json
    import os
    import stat
    import zipfile

    ck = tmp_path / "ck"
    assert _run(tmp_path, str(ck), "save").returncode == 0
    good = (ck / "ckpt-0000000007.pt").read_bytes()
    record = json.loads((ck / "ckpt-0000000007.json").read_text())
    assert record == {"file": "ckpt-0000000007.pt", "step": 7, "size": len(good),
                      "sha256": hashlib.sha256(good).hexdigest(), "run": None,  # (outside a job: no run)
                      "trial": False}
    assert stat.S_IMODE(os.stat(ck / "ckpt-0000000007.json").st_mode) == 0o600
    with zipfile.ZipFile(ck / "ckpt-0000000007.pt") as z:  # where the first tensor's bytes are
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    at = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 8
    changed = bytearray(good)
    changed[at] ^= 0x40
    (ck / "ckpt-0000000009.pt").write_bytes(bytes(changed))
    (ck / "ckpt-0000000009.json").write_text(json.dumps(dict(record, file="ckpt-0000000009.pt", step=9)))
    loaded = _run(tmp_path, str(ck), "load")
    said = loaded.stdout + loaded.stderr
    assert loaded.returncode == 0 and loaded.stdout.splitlines()[-2].startswith("step 7 "), said
    assert (f"clusterddp: checkpoint {ck}/ckpt-0000000009.pt (ValueError: its SHA-256 differs from its manifest's: "
            "changed after it was written)") in said, said
    (ck / "ckpt-0000000009.pt").unlink()
    (ck / "ckpt-0000000007.json").unlink()
    older = _run(tmp_path, str(ck), "load")
    assert older.returncode == 0 and older.stdout.splitlines()[-2].startswith("step 7 "), older.stderr


#: Another user, modelled with chown: root only.
as_root = pytest.mark.skipif(os.getuid() != 0, reason="models another user with chown: needs root")


@pytest.mark.ranks
@as_root
def test_checkpoints_planted_by_another_user_are_neither_loaded_nor_pruned_for(tmp_path):
    """Issue 41: in a checkpoint directory others can write, a weights-only checkpoint with a higher step planted
    by another user is not loaded (and does not push the job's own out of `keep`, nor is it pruned, nor is another
    user's temp file), and a FIFO named like a checkpoint does not hang the load."""
    import os
    import shutil

    ck = tmp_path / "ck"
    assert _run(tmp_path, str(ck), "save").returncode == 0
    os.chmod(ck, 0o777)
    planted = ck / "ckpt-0000000099.pt"
    shutil.copy(ck / "ckpt-0000000007.pt", planted)
    os.chown(planted, 4242, 4242)
    os.mkfifo(ck / "ckpt-0000000098.pt")
    loaded = _run(tmp_path, str(ck), "load")
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.splitlines()[-2].startswith("step 7 "), loaded.stdout
    assert "99" not in loaded.stdout + loaded.stderr and planted.exists()
    # Saving again prunes by the job's own checkpoints only: the planted ones neither count nor go
    foreign_tmp = ck / ".tmp-planted"
    foreign_tmp.write_bytes(b"x")
    os.chown(foreign_tmp, 4242, 4242)
    os.utime(foreign_tmp, (1, 1))  # old enough for the stale-temp sweep, but not the job's own
    assert _run(tmp_path, str(ck), "save").returncode == 0
    assert (ck / "ckpt-0000000007.pt").exists() and planted.exists() and foreign_tmp.exists()


HELD = r'''
import os, sys, torch
from clusterddp import runtime
runtime.init(allow_single=True)
print("joined", flush=True)
sys.stdin.readline()  # the test renames the run directory now
run = os.environ["CLUSTERDDP_RUN_DIR"]
model = torch.nn.Linear(3, 2)
runtime.Checkpointer(os.path.join(run, "checkpoints")).save(1, model)
runtime.report(step=1, loss=0.5)
runtime.save_on_main(model.state_dict(), os.path.join(run, "model.pt"))
runtime.shutdown()
'''


@pytest.mark.ranks
@as_root
def test_a_run_directory_renamed_after_init_redirects_none_of_the_runtime_s_files(tmp_path):
    """Issue 41 (whole paths): a rank holds its run directory open from init on and writes through that handle, so
    the directory renamed and another put in its place afterwards gets nothing (checkpoints, manifests, metrics,
    save_on_main, the rank's last hello all land in the one that was checked); and one that is not the user's own is
    refused at init."""
    import json
    import os

    script, run = tmp_path / "held.py", tmp_path / "out" / "run"
    script.write_text(HELD)
    run.mkdir(parents=True, mode=0o755)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "CLUSTERDDP_RUN_DIR": str(run)}
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "joined\n", proc.stderr.read()
        os.rename(run, tmp_path / "out" / "moved")
        run.mkdir(mode=0o755)
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        proc.kill() if proc.poll() is None else None
    assert proc.returncode == 0, err
    assert sorted(p.name for p in run.iterdir()) == [], "a file followed the name, not the directory"
    moved = tmp_path / "out" / "moved"
    held = {str(p.relative_to(moved)) for p in moved.rglob("*")}
    assert {"checkpoints/ckpt-0000000001.pt", "checkpoints/ckpt-0000000001.json", "metrics.jsonl",
            "model.pt"} <= held, held
    assert json.loads((moved / "stacks" / "ranks" / "rank-0.json").read_text())["state"] == "left"  # at shutdown

    os.chown(run, 4242, 4242)  # another user's directory where the run directory should be: init refuses it
    refused = subprocess.run([sys.executable, str(script)], input="go\n", capture_output=True, text=True,
                             timeout=120, env=env)
    assert refused.returncode != 0 and "joined" not in refused.stdout
    assert f"the run directory ($CLUSTERDDP_RUN_DIR) is not this job's own: {run} belongs to another user" \
        in refused.stderr, refused.stderr
