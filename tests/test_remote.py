"""Issue 17: submitting from a laptop to a cluster over SSH. A real sshd (Debian's openssh-server, throwaway keys)
on the test cluster's login node (network namespace cddp-login, 10.200.0.10, no slurmd), reached by the system's
ssh with connection sharing; rsync copies the code. The "laptop" is this process with SLURM_CONF pointing at a
second, independent Slurm cluster (its own controller and job ids) so that the same job id exists on both."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import login_node
from .conftest import CLUSTER_DIR, CLUSTER_SH, ROOT, SCRIPTS, run_cli
from .procs import wait_for

# SSH, rsync and records are the same on every Slurm release: one test runs on each, the rest on the newest.
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.slurm_releases("24.11", "26.05")]

SECOND = {"CLUSTERDDP_CLUSTER_DIR": f"{CLUSTER_DIR}-second", "CLUSTERDDP_CLUSTER_NAME": "second",
          "CLUSTERDDP_CLUSTER_NODES": "node9", "CLUSTERDDP_CLUSTER_SUBNET": "10.201.0",
          "CLUSTERDDP_CLUSTER_BRIDGE": "cddpbr1", "CLUSTERDDP_CLUSTER_IFPREFIX": "cddq-",
          "CLUSTERDDP_CLUSTER_LOGIN": "", "CLUSTERDDP_CLUSTER_PORT": "16917", "CLUSTERDDP_CLUSTER_TAG": "-second"}


def machine_slurm_path(path: str) -> str:
    """PATH with this machine's own Slurm clients (Debian 12's, 22.05), whichever release the test cluster runs:
    without the wrappers of a release that runs in its own root."""
    return os.pathsep.join(p for p in path.split(os.pathsep) if p != f"{CLUSTER_DIR}/bin")


@pytest.fixture(scope="module")
def login(slurm_cluster, tmp_path_factory):
    """sshd on the login node with a throwaway host key and user key; yields the ssh config file."""
    if not shutil.which("rsync") or not os.path.exists("/usr/sbin/sshd"):
        subprocess.run([str(CLUSTER_SH), "install"], check=True)
    yield login_node.start(tmp_path_factory.mktemp("ssh"))
    login_node.stop()


@pytest.fixture
def laptop(login, slurm_cluster, tmp_path):
    """A project directory with [clusters.tc] (the test cluster over SSH) and its environment: SLURM_CONF points
    nowhere useful for 'here' unless a test sets it, state and mirrors private to the test."""
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(ROOT / "examples" / "train_ddp.py", proj)
    shutil.copy(SCRIPTS / "hang.py", proj)
    (proj / "probe.py").write_text("import os, socket, clusterddp\n"
                                   "print('probe', os.environ.get('RANK'), socket.gethostname(), os.getcwd(), "
                                   "clusterddp.__file__, flush=True)\n")
    (proj / ".gitignore").write_text("data/\n*.ckpt\n")
    (proj / "data").mkdir()
    (proj / "data" / "big.bin").write_bytes(os.urandom(200_000))
    (proj / "old.ckpt").write_text("x")
    remote_home = tmp_path / "cluster-home"
    (proj / "clusterddp.toml").write_text("\n".join(login_node.cluster_table(name, host, login, remote_home) for
                                                    name, host in (("tc", "cddp-login"), ("stranger", "cddp-stranger"),
                                                                   ("closed", "cddp-closed"))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERDDP_"))}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), SLURM_CONF=str(tmp_path / "no-slurm-here.conf"))
    env["CLUSTERDDP_TRUST"] = str(proj / "clusterddp.toml")  # its [clusters.*] decide where code goes (issue 23)
    env["PATH"] = machine_slurm_path(env["PATH"])
    env.pop("XDG_RUNTIME_DIR", None)
    return proj, env, remote_home / "clusterddp" / "proj"


def joined(run_dir: Path, ranks: int) -> None:
    """Until every rank's hello says it joined its process group (an event, not a fixed sleep)."""
    def all_joined() -> bool:
        states = []
        for r in range(ranks):
            try:
                states.append(json.loads((run_dir / "stacks" / "ranks" / f"rank-{r}.json").read_text()).get("state"))
            except (OSError, ValueError):
                return False
        return all(s == "joined" for s in states)

    wait_for(all_joined, 120, f"{ranks} ranks to join in {run_dir}")


def _job_id(proc) -> str:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def _copied(stderr: str):
    m = re.search(r"copied (\d+) changed file\(s\), (\d+) bytes, to tc:(\S+)", stderr)
    assert m, stderr
    return int(m.group(1)), int(m.group(2)), m.group(3)


@pytest.mark.slurm_releases("24.11", "26.05")  # (issue 57: once per make test; the SSH path is the same on 22.05)
def test_submit_wait_logs_over_ssh(laptop):
    """The example, submitted from the laptop (a git work tree: git lists what is copied; ignored files stay), run
    on 2 nodes there, --wait follows it, per-rank logs come back; the job imports the clusterddp modules copied
    with it."""
    proj, env, remote = laptop
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    (proj / ".git" / "info" / "exclude").write_text("hang.py\n")
    proc = run_cli("submit", "--cluster", "tc", "--nodes", "2", "--gpus", "0", "--procs-per-node", "2", "-t", "5",
                   "train_ddp.py", "--wait", "--", "--epochs", "1", "--images", "2", "--depth", "3", cwd=proj, env=env,
                   timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = proc.stdout.strip().splitlines()[-1]
    files, _, path = _copied(proc.stderr)
    assert path == str(remote) and files >= 4
    assert (remote / "train_ddp.py").read_text() == (proj / "train_ddp.py").read_text()
    assert not (remote / "data").exists() and not (remote / "old.ckpt").exists()  # .gitignore'd: not copied
    assert not (remote / "hang.py").exists() and (remote / "probe.py").exists()  # git's own exclude file too
    assert not (proj / "clusterddp-runs").exists()  # nothing of the job is written on the laptop's side
    assert f"job {job} ended COMPLETED, exit code 0" in proc.stderr
    batch = run_cli("logs", "--cluster", "tc", job, cwd=proj, env=env)
    assert batch.returncode == 0 and "world size 4 (2 x 2)" in batch.stdout, batch.stderr
    rank0 = run_cli("logs", "--cluster", "tc", job, "--rank", "0", cwd=proj, env=env)
    assert rank0.returncode == 0 and "[default0]:epoch 1/1 done" in rank0.stdout, rank0.stderr
    rank3 = run_cli("logs", "--cluster", "tc", job, "--rank", "3", cwd=proj, env=env)  # (the example's rank 3 is
    assert rank3.returncode == 0, rank3.stderr                                          # mostly silent)
    assert all(line.startswith("[default1]:") for line in rank3.stdout.splitlines()), rank3.stdout
    state = Path(env["XDG_STATE_HOME"]) / "clusterddp"
    assert (state / "jobs" / "tc" / f"{job}.json").is_file()
    # Issue 42 over SSH: the goodput line at the end of --wait, top made on the login node, the report from the copy
    assert re.search(r"clusterddp: goodput \d+%: ", proc.stderr), proc.stderr
    top = run_cli("top", "--cluster", "tc", "--once", job, cwd=proj, env=env, timeout=120)
    assert top.returncode == 0, top.stdout + top.stderr
    assert sorted(line.split()[0] for line in top.stdout.splitlines()[2:6]) == ["node1", "node1", "node2", "node2"]
    report = run_cli("report", "--cluster", "tc", job, cwd=proj, env=env, timeout=120)
    assert report.returncode == 0 and "4 ranks, median step" in report.stdout, report.stdout + report.stderr
    # The probe: where the job runs and which clusterddp it imports.
    probe = run_cli("submit", "--cluster", "tc", "--launcher", "srun", "--nodes", "2", "--gpus", "0",
                    "--procs-per-node", "2", "probe.py", "--wait", cwd=proj, env=env, timeout=200)
    assert probe.returncode == 0, probe.stderr
    pjob = probe.stdout.strip().splitlines()[-1]
    out = run_cli("logs", "--cluster", "tc", pjob, "--rank", "2", cwd=proj, env=env).stdout.split()
    assert out[:3] == ["probe", "2", "node2"], out
    # (it runs in its submission's snapshot of the copy, REMOTE_DIR/.snapshots/<project>/<time>-<random>; issue 23)
    assert re.fullmatch(rf"{re.escape(str(remote.parent))}/\.snapshots/proj/\d{{8}}-\d{{6}}-\w{{6}}", out[3]), out
    assert f"this job runs its own snapshot of the code (a later submit does not change it): {out[3]}" in probe.stderr
    assert re.fullmatch(rf"{re.escape(str(remote.parent))}/\.lib/[0-9a-f]{{12}}/clusterddp/__init__\.py", out[4])
    # Issue 38: --dry-run prints exactly the script submit wrote there (outputs by their absolute path there).
    dry = run_cli("submit", "--dry-run", "--cluster", "tc", "--launcher", "srun", "--nodes", "2", "--gpus", "0",
                  "--procs-per-node", "2", "probe.py", cwd=proj, env=env, timeout=100)
    assert dry.returncode == 0 and "warning" not in dry.stderr, dry.stderr
    written = re.search(r"^  script (\S+)$", probe.stderr, re.M)
    assert written and dry.stdout == Path(written.group(1)).read_text(), (dry.stdout, probe.stderr)


def test_copies_only_what_changed(laptop):
    proj, env, remote = laptop
    (proj / ".git").mkdir()
    (proj / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (proj / "clusterddp-runs").mkdir()  # a --local run's outputs
    (proj / "clusterddp-runs" / "old.out").write_text("local\n")
    argv = ("submit", "--cluster", "tc", "--gpus", "0", "--sbatch-arg=--hold", "probe.py")
    first = run_cli(*argv, cwd=proj, env=env)
    files1, bytes1, _ = _copied(first.stderr)
    assert not (remote / ".git").exists() and not (remote / "clusterddp-runs" / "old.out").exists()
    (remote / "checkpoints").mkdir()  # what a job wrote into the copy: never deleted or overwritten by a copy
    (remote / "checkpoints" / "epoch1.pt").write_text("weights\n")
    again = run_cli(*argv, cwd=proj, env=env)
    files2, bytes2, _ = _copied(again.stderr)
    assert files2 == 0 and bytes2 < bytes1, (first.stderr, again.stderr)
    (proj / "probe.py").write_text((proj / "probe.py").read_text() + "print('changed')\n")
    changed = run_cli(*argv, cwd=proj, env=env)
    files3, bytes3, _ = _copied(changed.stderr)
    assert files3 == 1 and bytes2 < bytes3 < bytes1, (first.stderr, changed.stderr)
    assert "print('changed')" in (remote / "probe.py").read_text()
    assert (remote / "checkpoints" / "epoch1.pt").read_text() == "weights\n"
    for proc in (first, again, changed):
        assert run_cli("cancel", "--cluster", "tc", _job_id(proc), cwd=proj, env=env).returncode == 0


def test_a_queued_job_runs_the_code_it_was_submitted_with(laptop):
    """Submit (held), edit, submit again: the first job, released after the second submit, runs the first version of
    the script, and of a module it imports, in its own snapshot; the outputs of both jobs are under the project's
    copy; the snapshot's unchanged files are hard links, not copies."""
    proj, env, remote = laptop
    (proj / "helper.py").write_text("VERSION = 1\n")
    (proj / "versioned.py").write_text("import os, helper\nprint('version', helper.VERSION, open('note.txt').read(), "
                                       "os.getcwd(), flush=True)\n")
    (proj / "note.txt").write_text("first")
    argv = ("submit", "--cluster", "tc", "--launcher", "srun", "--gpus", "0", "versioned.py")
    first = _job_id(run_cli(*argv, "--sbatch-arg=--hold", cwd=proj, env=env))
    (proj / "helper.py").write_text("VERSION = 2\n")
    (proj / "note.txt").write_text("secnd")  # the same size, the same second
    second = run_cli(*argv, "--wait", cwd=proj, env=env, timeout=200)
    assert second.returncode == 0, second.stderr
    cluster_env = {**os.environ, "SLURM_CONF": f"{CLUSTER_DIR}/slurm.conf"}
    subprocess.run(["scontrol", "release", first], env=cluster_env, check=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = [ln.split() for ln in run_cli("status", "--cluster", "tc", cwd=proj, env=env).stdout.splitlines()]
        if any(r[:2] == [first, "COMPLETED"] or r[1:3] == [first, "COMPLETED"] for r in rows):
            break
        time.sleep(1)
    logs = {job: run_cli("logs", "--cluster", "tc", job, "--rank", "0", cwd=proj, env=env).stdout.split()
            for job in (first, _job_id(second))}
    assert logs[first][:3] == ["version", "1", "first"], logs
    assert logs[_job_id(second)][:3] == ["version", "2", "secnd"], logs
    snaps = {job: Path(out[3]) for job, out in logs.items()}
    assert len(set(snaps.values())) == 2 and all(s.parent == remote.parent / ".snapshots" / "proj"
                                                 for s in snaps.values()), snaps
    assert (snaps[first] / "versioned.py").stat().st_ino == (remote / "versioned.py").stat().st_ino  # a link
    assert (snaps[first] / "helper.py").stat().st_ino != (remote / "helper.py").stat().st_ino
    assert not (snaps[first] / "clusterddp-runs").exists()
    assert sorted(p.name for p in (remote / "clusterddp-runs").glob("versioned-*.out")) == sorted(
        f"versioned-{job}.out" for job in logs), list((remote / "clusterddp-runs").iterdir())


@pytest.fixture
def second_cluster(slurm_cluster):
    """Another Slurm cluster whose first job id is the test cluster's next one: the 'here' of the laptop."""
    main = {**os.environ, "SLURM_CONF": f"{CLUSTER_DIR}/slurm.conf"}
    config = subprocess.run(["scontrol", "show", "config"], env=main, capture_output=True, text=True).stdout
    next_id = re.search(r"NEXT_JOB_ID\s*=\s*(\d+)", config).group(1)
    env = {**os.environ, **SECOND, "CLUSTERDDP_CLUSTER_FIRST_JOB_ID": next_id}
    env["PATH"] = machine_slurm_path(env["PATH"])
    subprocess.run([str(CLUSTER_SH), "down"], env=env, check=False, capture_output=True)
    try:
        subprocess.run([str(CLUSTER_SH), "up"], env=env, check=True)
        yield f"{SECOND['CLUSTERDDP_CLUSTER_DIR']}/slurm.conf"
    finally:
        subprocess.run([str(CLUSTER_SH), "down"], env=env, check=False)


def test_same_job_id_on_two_clusters(laptop, second_cluster):
    """A remote job and a job of this machine's Slurm with the same id: both recorded, both in status under their
    cluster, each one's logs its own; a second remote job is cancelled over SSH."""
    proj, env, _ = laptop
    env = {**env, "SLURM_CONF": second_cluster}
    far = _job_id(run_cli("submit", "--cluster", "tc", "--launcher", "srun", "--gpus", "0", "probe.py", "--wait",
                          cwd=proj, env=env, timeout=200))
    near = _job_id(run_cli("submit", "--launcher", "srun", "--gpus", "0", "probe.py", "--wait", cwd=proj, env=env,
                           timeout=200))
    assert far == near
    stuck = _job_id(run_cli("submit", "--cluster", "tc", "--launcher", "srun", "--gpus", "0", "--hang-timeout", "0",
                            "hang.py", "--", "--where", "rendezvous", "--rank", "0", cwd=proj, env=env))
    cancel = run_cli("cancel", "--cluster", "tc", stuck, cwd=proj, env=env)
    assert cancel.returncode == 0 and f"job {stuck} on cluster tc" in cancel.stderr
    deadline = time.monotonic() + 60
    while True:
        status = run_cli("status", cwd=proj, env=env)
        rows = [line.split() for line in status.stdout.splitlines()]
        if any(r[:3] == ["tc", stuck, "CANCELLED"] for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert rows[0][:2] == ["CLUSTER", "JOBID"], status.stdout
    assert any(r[:3] == ["tc", far, "COMPLETED"] for r in rows), status.stdout
    assert any(r[:3] == ["here", near, "COMPLETED"] for r in rows), status.stdout
    assert any(r[:3] == ["tc", stuck, "CANCELLED"] for r in rows), status.stdout
    far_log = run_cli("logs", "--cluster", "tc", far, "--rank", "0", cwd=proj, env=env).stdout.split()
    # (the id is recorded on both clusters: without --cluster it is refused, naming both; issue 22)
    both = run_cli("logs", near, "--rank", "0", cwd=proj, env=env)
    assert both.returncode == 2 and f"job {near} is recorded on several clusters (here, tc)" in both.stderr
    near_log = run_cli("logs", "--cluster", "here", near, "--rank", "0", cwd=proj, env=env).stdout.split()
    assert far_log[2].startswith("node") and far_log[2] != "node9"
    assert near_log[2] == "node9" and near_log[3] == str(proj)
    jobs = Path(env["XDG_STATE_HOME"]) / "clusterddp" / "jobs"
    assert (jobs / "tc" / f"{far}.json").is_file() and (jobs / "here" / f"{near}.json").is_file()
    # A cluster that cannot be reached any more: its rows say so, the others are still shown.
    (jobs / "closed").mkdir()
    (jobs / "closed" / f"{far}.json").write_text((jobs / "tc" / f"{far}.json").read_text())
    listing = run_cli("status", cwd=proj, env=env)
    rows = [line.split(None, 3) for line in listing.stdout.splitlines()]
    assert listing.returncode == 1 and "Traceback" not in listing.stderr
    assert any(["closed", far, "UNREACHABLE"] == r[:3] for r in rows), listing.stdout
    said = [line for line in listing.stdout.splitlines() if line.startswith("clusterddp: cluster 'closed': ")]
    assert len(said) == 1 and "the host does not answer" in said[0], listing.stdout  # once, below the table
    assert any(r[:3] == ["tc", far, "COMPLETED"] for r in rows) and any(r[:2] == ["here", near] for r in rows)


def test_doctor_over_ssh(laptop):
    proj, env, _ = laptop
    proc = run_cli("doctor", "--cluster", "tc", "--nodes", "2", "--gpus", "0", "--procs-per-node", "2", cwd=proj,
                   env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "on cluster tc" in proc.stderr and "node1" in proc.stdout and "node2" in proc.stdout, proc.stdout


def test_stacks_and_follow_over_ssh(laptop):
    """stacks runs where the run directory is (the login node, with the job's Python and the copied modules);
    logs --follow copies the new lines as they come."""
    proj, env, remote = laptop
    job = _job_id(run_cli("submit", "--cluster", "tc", "--launcher", "srun", "--nodes", "2", "--gpus", "0",
                          "--procs-per-node", "2", "--hang-timeout", "0", "hang.py", "--", "--where",
                          "before-allreduce", "--rank", "3", cwd=proj, env=env))
    deadline = time.monotonic() + 90
    while "RUNNING" not in run_cli("status", "--cluster", "tc", job, cwd=proj, env=env).stdout:
        assert time.monotonic() < deadline
        time.sleep(1)
    follow = subprocess.Popen([sys.executable, "-m", "clusterddp", "logs", "--cluster", "tc", job, "--rank", "1",
                               "-f"], cwd=proj, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    joined(remote / "clusterddp-runs" / f"hang-{job}", 4)  # every rank started and joined (then 0-2 wait, 3 sleeps)
    stacks = run_cli("stacks", "--cluster", "tc", job, cwd=proj, env=env, timeout=200)
    assert stacks.returncode == 0, stacks.stdout + stacks.stderr
    assert "3 of 4 ranks wait at the same place" in stacks.stdout and "(ranks 0-2 on 2 nodes)" in stacks.stdout, \
        stacks.stdout
    assert re.search(r"^rank 3 \(node2\) is elsewhere: .*hang\.py", stacks.stdout, re.M), stacks.stdout
    assert run_cli("cancel", "--cluster", "tc", job, cwd=proj, env=env).returncode == 0
    out, err = follow.communicate(timeout=90)
    assert follow.returncode == 0 and "joined rank 1 of 4" in out, out + err


def test_a_job_id_finds_its_cluster(laptop, tmp_path):
    """Issue 22: after `submit --cluster tc`, status/stacks/logs/cancel with the job id alone go to tc (one line
    says so), and no Slurm command of this machine runs (recording stand-ins first on PATH prove it)."""
    from .test_routing import recording_standins

    proj, env, remote = laptop
    job = _job_id(run_cli("submit", "--cluster", "tc", "--launcher", "srun", "--gpus", "0", "--procs-per-node", "2",
                          "--hang-timeout", "0", "hang.py", "--", "--where", "before-allreduce", "--rank", "1",
                          cwd=proj, env=env))
    log = tmp_path / "local-slurm.log"
    env = {**env, "PATH": f"{recording_standins(tmp_path / 'standins', log)}{os.pathsep}{env['PATH']}"}
    said = f"clusterddp: job {job} is on cluster tc (from clusterddp's record of it; --cluster chooses another)"
    deadline = time.monotonic() + 90
    while True:
        status = run_cli("status", job, cwd=proj, env=env)
        assert status.returncode == 0 and said in status.stderr.splitlines(), status.stdout + status.stderr
        if "RUNNING" in status.stdout:
            break
        assert time.monotonic() < deadline, status.stdout
        time.sleep(1)
    joined(remote / "clusterddp-runs" / f"hang-{job}", 2)
    stacks = run_cli("stacks", job, cwd=proj, env=env, timeout=200)
    assert stacks.returncode == 0 and "hang.py" in stacks.stdout, stacks.stdout + stacks.stderr
    assert re.search(r"^rank 1 \(node1\) is elsewhere: .*hang\.py", stacks.stdout, re.M), stacks.stdout
    assert said in stacks.stderr
    logs = run_cli("logs", job, cwd=proj, env=env)
    assert logs.returncode == 0 and "world size 2" in logs.stdout and said in logs.stderr, logs.stderr
    cancel = run_cli("cancel", job, cwd=proj, env=env)
    assert cancel.returncode == 0 and f"cancel requested for job {job} on cluster tc" in cancel.stderr, cancel.stderr
    assert not log.exists(), log.read_text()


def test_a_tcsh_login_shell(login, laptop):
    """root's login shell is tcsh on cddp-tcsh (sshd runs commands with it): without shell set, one line says what
    to add, before anything is submitted; with shell = "bash -l", copy, pre-flight, sbatch, --wait and logs work."""
    proj, env, remote = laptop
    home = remote.parent.parent
    toml = proj / "clusterddp.toml"
    toml.write_text(toml.read_text() + login_node.cluster_table("tsh", "cddp-tcsh", login, home)
                    + login_node.cluster_table("tshb", "cddp-tcsh", login, home) + 'shell = "bash -l"\n')
    said = subprocess.run(["ssh", "-F", str(login), "cddp-tcsh", "echo $shell"], capture_output=True, text=True)
    assert said.stdout.strip() == "/usr/bin/tcsh", said  # the login shell really is tcsh
    for argv in (("status", "--cluster", "tsh", "123"), ("submit", "--cluster", "tsh", "--gpus", "0", "probe.py")):
        _one_line(run_cli(*argv, cwd=proj, env=env), 1, "the login shell of cluster 'tsh' (ssh cddp-tcsh) is not "
                  "sh-like (it said ", 'add shell = "bash -l" to [clusters.tsh]')
    job = run_cli("submit", "--cluster", "tshb", "--launcher", "srun", "--gpus", "0", "probe.py", "--wait",
                  cwd=proj, env=env, timeout=200)
    out = run_cli("logs", "--cluster", "tshb", _job_id(job), "--rank", "0", cwd=proj, env=env)
    assert out.returncode == 0 and out.stdout.split()[:3] == ["probe", "0", "node1"], out.stdout + out.stderr
    assert run_cli("status", "--cluster", "tshb", _job_id(job), cwd=proj, env=env).returncode == 0


def _on_a_terminal(argv, cwd: Path, env: dict, answer: str = "", timeout: float = 90):
    """``argv`` in a session of its own whose controlling terminal is a pty, as from a user's terminal; ``answer``
    is typed after a password prompt. Returns (exit code, everything the terminal showed)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    shown, typed, deadline, status = b"", False, time.monotonic() + timeout, None
    try:
        while True:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:  # EIO: nobody holds the terminal any more
                    chunk = b""
                shown += chunk
                if answer and not typed and b"password:" in shown.lower():
                    os.write(fd, answer.encode() + b"\n")
                    typed = True
                if not chunk and status is not None:
                    break
            elif status is not None:
                break  # ended, and all it showed was read
            if status is None:
                done, raw = os.waitpid(pid, os.WNOHANG)
                status = os.waitstatus_to_exitcode(raw) if done else None
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                raise AssertionError(f"{argv} did not end within {timeout} s; the terminal showed {shown!r}")
    finally:
        os.close(fd)
    return status, shown.decode(errors="replace")


def test_a_password_is_asked_on_the_terminal_once_per_connection(login, laptop):
    """ssh asks on the user's terminal (not through clusterddp, which captures ssh's output); the shared
    connection then serves the next command without a prompt; the password is in no file clusterddp wrote."""
    proj, env, remote = laptop
    toml = proj / "clusterddp.toml"
    toml.write_text(toml.read_text() + login_node.cluster_table("pw", "cddp-password", login, remote.parent.parent))
    argv = [sys.executable, "-m", "clusterddp", "status", "--cluster", "pw", "999999"]
    code, shown = _on_a_terminal(argv, proj, env, answer=login_node.PASSWORD)
    assert "root@10.200.0.10's password:" in shown, shown
    assert code == 1 and "job 999999 is unknown to Slurm" in shown, shown  # Slurm there answered
    code, shown = _on_a_terminal(argv, proj, env)  # nothing typed: a prompt would time out the test
    assert code == 1 and "job 999999 is unknown to Slurm" in shown and "password" not in shown, shown
    written = [p for p in Path(env["XDG_STATE_HOME"]).rglob("*") if p.is_file()] + [toml]
    assert not [p for p in written if login_node.PASSWORD.encode() in p.read_bytes()]


def _one_line(proc, code: int, *needles: str) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_refused_key_unreachable_host_missing_python(laptop):
    proj, env, _ = laptop
    refused = run_cli("submit", "--cluster", "stranger", "--gpus", "0", "probe.py", cwd=proj, env=env)
    _one_line(refused, 1, "cannot log in to cluster 'stranger' (ssh cddp-stranger): the key was refused",
              "(ssh-copy-id -F /", " cddp-stranger) or name it")  # the cluster's ssh_config: what works by hand
    closed = run_cli("status", "--cluster", "closed", "123", cwd=proj, env=env)
    _one_line(closed, 1, "cannot log in to cluster 'closed' (ssh cddp-closed): the host does not answer",
              "Connection refused")
    nopy = run_cli("submit", "--cluster", "tc", "--gpus", "0", "--launcher", "srun", "--python", "python3.99",
                   "probe.py", cwd=proj, env=env)
    _one_line(nopy, 2, "has no 'python3.99' on PATH", "setup = [\"module load python\"]")
    unknown = run_cli("submit", "--cluster", "tcc", "--gpus", "0", "probe.py", cwd=proj, env=env)
    _one_line(unknown, 2, "unknown cluster 'tcc' (did you mean 'tc'?)")
    too_big = run_cli("submit", "--cluster", "tc", "--gpus", "0", "--nodes", "4", "probe.py", cwd=proj, env=env)
    _one_line(too_big, 2, "partition debug has 3 node")  # sinfo of that cluster, over SSH
    outside = run_cli("submit", "--cluster", "tc", "--gpus", "0", str(proj / "probe.py"), cwd=proj, env=env)
    _one_line(outside, 2, "is not a path inside the directory you submit from")


def test_the_documented_profiles_submit_for_real(login, laptop, tmp_path):
    """Issue 52: each profile docs/remote.md shows, used for a real submission over SSH. The minimal one (only
    host; ssh_config stands for the laptop's ~/.ssh/config) puts the copy under the home's clusterddp/, the home
    reached through a link (/home/me -> /gpfs/home/me) and Slurm found through the site's login environment;
    remote_dir = "~/x"; and the full example (its setup lines: `module load slurm`, a venv's activate) with an
    absolute remote_dir. status, logs and cancel each work for them."""
    proj, env, _ = laptop
    shutil.copy(SCRIPTS / "plumbing.py", proj)
    (proj / "sleepy.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    real = tmp_path / "gpfs-home"
    real.mkdir(mode=0o700)
    home = tmp_path / "home-link"
    home.symlink_to(real)
    bins = f"{CLUSTER_DIR}/bin:{Path(sys.executable).parent}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    (real / ".bashrc").write_text(  # what a site's Lmod init gives bash run by sshd: a `module` function
        f'module() {{ echo "$*" >> "$HOME/module.log"; [ "$*" = "load slurm" ] && '
        f'export SLURM_CONF={CLUSTER_DIR}/slurm.conf PATH="{CLUSTER_DIR}/bin:$PATH"; }}\n')
    (real / "venvs" / "torch" / "bin").mkdir(parents=True)
    (real / "venvs" / "torch" / "bin" / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    host = login_node.start_home(login.parent, login, home,
                                 {"SLURM_CONF": f"{CLUSTER_DIR}/slurm.conf", "PATH": bins})
    scratch = tmp_path / "scratch" / "cddp"
    (proj / "clusterddp.toml").write_text(
        f'[clusters.mini]\nhost = "{host}"\nssh_config = "{login}"\n\n'
        f'[clusters.tilde]\nhost = "{host}"\nssh_config = "{login}"\nremote_dir = "~/x"\n\n'
        f'[clusters.full]\nhost = "{host}"\nssh_config = "{login}"\n'
        'setup = ["module load slurm", "source ~/venvs/torch/bin/activate"]   # the docs\' example\n'
        f'remote_dir = "{scratch}"\n')
    where = {"mini": real / "clusterddp" / "proj", "tilde": real / "x" / "proj", "full": scratch / "proj"}
    jobs = {}
    for name in ("mini", "full"):
        proc = run_cli("submit", "--cluster", name, "--launcher", "srun", "--nodes", "2", "--gpus", "0",
                       "--procs-per-node", "2", "-t", "5", "plumbing.py", "--wait", cwd=proj, env=env, timeout=240)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        jobs[name] = proc.stdout.strip().splitlines()[-1]
        assert f"to {name}:{where[name]} (ssh {host})" in proc.stderr, proc.stderr
        assert f"job {jobs[name]} ended COMPLETED, exit code 0" in proc.stderr, proc.stderr
        assert (where[name] / "plumbing.py").is_file()
        status = run_cli("status", "--cluster", name, jobs[name], cwd=proj, env=env)
        assert status.returncode == 0 and "COMPLETED" in status.stdout, status.stdout + status.stderr
        rank3 = run_cli("logs", "--cluster", name, jobs[name], "--rank", "3", cwd=proj, env=env)
        assert rank3.returncode == 0 and '"rank": 3' in rank3.stdout and '"sum": 10.0' in rank3.stdout, rank3.stdout
    assert (real / "module.log").read_text().splitlines().count("load slurm") >= 2  # the setup line ran there
    assert list((real / "clusterddp" / ".lib").glob("*/clusterddp/runtime/__init__.py"))  # the modules beside it
    # remote_dir = "~/x": submitted, seen running, its log read, cancelled.
    job = _job_id(run_cli("submit", "--cluster", "tilde", "--launcher", "srun", "--gpus", "0", "sleepy.py",
                          cwd=proj, env=env, timeout=120))
    assert (where["tilde"] / "sleepy.py").is_file()
    wait_for(lambda: "up" in run_cli("logs", "--cluster", "tilde", job, "--rank", "0", cwd=proj, env=env).stdout,
             90, f"job {job}'s rank 0 to start")
    assert "RUNNING" in run_cli("status", "--cluster", "tilde", job, cwd=proj, env=env).stdout
    cancel = run_cli("cancel", "--cluster", "tilde", job, cwd=proj, env=env)
    assert cancel.returncode == 0, cancel.stderr
    wait_for(lambda: "CANCELLED" in run_cli("status", "--cluster", "tilde", job, cwd=proj, env=env).stdout, 60,
             f"job {job} to be cancelled")
