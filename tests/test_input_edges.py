"""Unusual input: every value reaches the job unchanged or is refused in one line before anything is written; no
traceback, no unbounded work, nothing overwritten without asking."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterddp import JobSpec, SpecError
from clusterddp.backends.slurm.commands import Partition
from clusterddp.backends.slurm.preflight import check_cluster
from clusterddp.backends.slurm.script import render
from clusterddp.cli import cli
from clusterddp.errors import HostlistError
from clusterddp.hostlist import expand

from .conftest import cli_runner

ROOT = Path(__file__).resolve().parent.parent
LONG = "x" * 256  # one path component over the 255 bytes file systems allow


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    (tmp_path / ".git").mkdir()
    (tmp_path / "train.py").write_text("print('hi')\n")
    return cli_runner()


def refused(r, *words: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.stdout[-300:], r.stderr[-300:])
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("clusterddp: error: "), r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    for word in words:
        assert word in r.stderr, r.stderr


def test_printed_script_is_byte_for_byte_the_written_one(runner, tmp_path):
    setup = "printf '\x1b[31mred\x1b[0m\\n'"  # an escape sequence in a --setup line (shell code, kept verbatim)
    args = ["--setup", setup, "train.py", "--", "\x1b[1mbold"]
    printed = runner.invoke(cli, ["render", *args])
    written = runner.invoke(cli, ["render", "-o", "job.sh", *args])
    dry = runner.invoke(cli, ["submit", "--dry-run", *args])
    assert printed.exit_code == written.exit_code == dry.exit_code == 0
    expected = render(JobSpec("train.py", setup=(setup,), args=("\x1b[1mbold",)))
    assert printed.stdout == (tmp_path / "job.sh").read_text() == dry.stdout == expected
    assert "\x1b[31m" in printed.stdout


@pytest.mark.parametrize("argv", [
    ["render", "train.py", "--", b"\xff\xfe".decode("utf-8", "surrogateescape")],
    ["render", "-e", "X=" + b"caf\xe9".decode("utf-8", "surrogateescape"), "train.py"],
    ["render", "--job-name", b"\xff".decode("utf-8", "surrogateescape"), "train.py"],
    ["submit", "--dry-run", "--setup", b"echo \xff".decode("utf-8", "surrogateescape"), "train.py"],
])
def test_bytes_that_are_not_utf8_are_refused_in_one_line(tmp_path, argv):
    """Through a real process (argv carries raw bytes), in a strict locale too."""
    (tmp_path / "train.py").write_text("")
    for lang in ("C.UTF-8", "C"):
        env = dict(os.environ, LC_ALL=lang, LANG=lang, PYTHONPATH=str(ROOT))
        raw = [a.encode("utf-8", "surrogateescape") for a in argv]
        proc = subprocess.run([sys.executable.encode(), b"-m", b"clusterddp", *raw], cwd=tmp_path, env=env,
                              capture_output=True)
        err = proc.stderr.decode("utf-8", "replace")
        assert proc.returncode == 2 and "not valid UTF-8" in err and "Traceback" not in err, err
        assert err.count("\n") == 1
    assert not (tmp_path / "clusterddp-runs").exists()


@pytest.mark.parametrize("value", [" 90", "90 ", "９０", "1-２", "99999999999", "2147483648", "0"])
def test_time_limits_as_sbatch_reads_them(value):
    with pytest.raises(SpecError, match="invalid time limit"):
        JobSpec("t.py", time=value)


@pytest.mark.parametrize("hosts", ["node[１-２]", "node[1-2 ]", "node[ 1-2]", "node[1 -2]"])
def test_host_lists_as_slurm_reads_them(hosts):
    with pytest.raises(HostlistError):
        list(expand(hosts))


@pytest.mark.parametrize("field,value", [("nodes", 2**31), ("gpus_per_node", 2**31), ("procs_per_node", 2**31),
                                         ("cpus_per_task", 2**31)])
def test_counts_are_bounded_by_what_slurm_accepts(field, value):
    with pytest.raises(SpecError, match="at most 2147483647"):
        JobSpec("t.py", **{field: value})


def test_largest_job_slurm_accepts_explains_in_bounded_memory(tmp_path):
    """explain and a dry run at Slurm's maximum node count: bounded memory (512 MB address space here)."""
    (tmp_path / "t.py").write_text("")
    for command in ("explain", "render"):
        code = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, (2**29, 2**29)); "
                f"from clusterddp.cli import main; main([{command!r}, '--nodes', '2147483647', '--gpus', '8', 't.py'])")
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert proc.returncode == 0, proc.stderr[-500:]
        assert "17179869176" in proc.stdout  # the world size, computed, never enumerated


@pytest.mark.parametrize("argv,words", [
    (["render", LONG + ".py"], ["path component of 259 bytes"]),
    (["render", "--output-dir", LONG, "train.py"], ["path component of 256 bytes"]),
    (["render", "--template", LONG, "train.py"], ["template"]),
    (["render", "--template-dir", LONG, "train.py"], ["template directory"]),
    (["render", "-o", LONG, "train.py"], ["cannot write -o"]),
    (["render", "-o", "missing/dir/job.sh", "train.py"], ["does not exist"]),
    (["render", "-o", "train.py", "train.py"], ["is the training script itself"]),
    (["render", "--template", "base", "train.py"], ["building block"]),
    (["render", "--template", "rendezvous", "train.py"], ["building block"]),
    (["render", "--time", "10", "--signal-before", "60", "--stop-grace", "60", "train.py"], ["stop_grace=60"]),
    (["explain", "train.py", "--", "--batch-size", "²"], []),
])
def test_no_traceback_and_no_overwrite(runner, tmp_path, argv, words):
    before = (tmp_path / "train.py").read_text()
    r = runner.invoke(cli, argv)
    if argv[0] == "explain":
        assert r.exit_code == 0 and r.exception is None, r.stderr
        return
    refused(r, *words)
    assert (tmp_path / "train.py").read_text() == before


@pytest.mark.parametrize("toml,words", [
    ("defaults = 5", ["defaults must be a table"]),
    ('profiles = "x"', ["profiles must be a table"]),
    ("[[profiles]]\nnodes = 2", ["profiles must be a table"]),
    ("[profiles]\nbig = 3", ["profiles.big must be a table"]),
    ('[defaults]\nnodes = "²"', ["nodes must be an integer"]),
    ("[defaults]\nenv = { FLAG = true }", ["env.FLAG must be a string", 'FLAG = "true"']),
    ("[defaults]\nenv = { LR = 1500.0 }", ["env.LR must be a string"]),
])
def test_profiles_of_the_wrong_shape(runner, tmp_path, toml, words):
    (tmp_path / "clusterddp.toml").write_text(toml + "\n")
    refused(runner.invoke(cli, ["render", "train.py"]), *words)


def test_pyproject_tool_table_of_the_wrong_shape(runner, tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool]\nclusterddp = 5\n")
    refused(runner.invoke(cli, ["render", "train.py"]), "[tool.clusterddp] must be a table")


def test_integer_profile_env_values_keep_their_digits(runner, tmp_path):
    (tmp_path / "clusterddp.toml").write_text("[defaults]\nenv = { NCCL_BUFFSIZE = 4194304 }\n")
    assert "export NCCL_BUFFSIZE=4194304\n" in runner.invoke(cli, ["render", "train.py"]).stdout


def test_environment_counts_in_ascii_digits(runner):
    refused(runner.invoke(cli, ["render", "train.py"], env={"CLUSTERDDP_NODES": "²"}), "nodes must be an integer")


def test_local_says_which_options_it_does_not_apply(runner):
    r = runner.invoke(cli, ["submit", "--local", "--dry-run", "--time", "5", "--mem", "4G", "--setup", "echo x",
                            "--sbatch-arg=--mail-type=END", "--apptainer", "img.sif", "train.py"])
    assert r.exit_code == 0, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if "does not apply" in ln)
    for flag in ("--setup", "--apptainer", "--time", "--mem", "--sbatch-arg"):
        assert flag in line
    plain = runner.invoke(cli, ["submit", "--local", "--dry-run", "train.py"])
    assert "does not apply" not in plain.stderr


def test_partition_lists_are_checked_like_sbatch():
    parts = {"gpu": Partition("gpu", 4, None, 8, 64, 256000), "debug": Partition("debug", 2, 3600, 0, 8, 16000)}
    assert check_cluster(JobSpec("t.py", partition="gpu,debug", nodes=2, gpus_per_node=8), parts) == []
    assert check_cluster(JobSpec("t.py", partition="gpu,debug", nodes=2), parts) == []
    from clusterddp.errors import PreflightError

    with pytest.raises(PreflightError, match="partition 'nope' does not exist"):
        check_cluster(JobSpec("t.py", partition="gpu,nope"), parts)
    with pytest.raises(PreflightError, match="partition gpu has 4 node"):
        check_cluster(JobSpec("t.py", partition="gpu,debug", nodes=8), parts)


def test_a_second_job_with_the_same_id_keeps_the_first_record(tmp_path, monkeypatch):
    from clusterddp.backends.record import JobRecord, state_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    first = JobRecord("7", "/a/first.sbatch", "/a/t-7.out", "/a/t-7", "srun", 2, 2)
    second = JobRecord("7", "/b/second.sbatch", "/b/t-7.out", "/b/t-7", "torchrun", 1, 1)
    first.save()
    first.save()  # the same job saved again: still one record
    here = state_dir() / "here"
    assert sorted(p.name for p in here.iterdir()) == ["7.json"]
    second.save()
    assert sorted(p.name for p in here.iterdir()) == ["7.json", "7.json.1"]
    assert JobRecord.load("7") == second
    import json

    assert json.loads((here / "7.json.1").read_text())["script_path"] == "/a/first.sbatch"
    # Job 7 of another cluster is another job: its own record, nothing of "here" moved aside.
    far = JobRecord("7", "/c/far.sbatch", "/c/t-7.out", "/c/t-7", "srun", 1, 1, cluster="tc")
    far.save()
    assert sorted(p.name for p in here.iterdir()) == ["7.json", "7.json.1"]
    assert JobRecord.load("7", "tc") == far and JobRecord.load("7") == second


def test_records_from_before_clusters_are_still_found(tmp_path, monkeypatch):
    import json

    from clusterddp.backends.record import JobRecord, recent, state_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    state_dir().mkdir(parents=True)
    (state_dir() / "5.json").write_text(json.dumps({"job_id": "5", "script_path": "/a/x.sbatch", "batch_log": "b",
                                                    "run_dir": "r", "launcher": "srun", "procs_per_node": 1,
                                                    "nodes": 1}))
    old = JobRecord.load("5")
    assert old is not None and old.cluster == "here" and old.python == "python3"
    assert JobRecord.load("5", "tc") is None
    assert [(r.cluster, r.job_id) for r in recent()] == [("here", "5")]


def test_host_expression_products_are_bounded():
    with pytest.raises(HostlistError, match="names more than"):
        next(iter(expand("a[1-65536]b[1-65536]")))
    assert len(expand("a[1-1000]b[1-100]")) == 100_000


@pytest.mark.parametrize("kwargs", [dict(env=(("A\n", "1"),)), dict(script="pkg.train\n", module=True),
                                    dict(mem="64G\n"), dict(array="0-3\n"), dict(sbatch_args=("--hold\n",))])
def test_a_trailing_newline_is_not_a_name(kwargs):
    """Python's '$' matches before a final newline: the patterns are full matches."""
    script = kwargs.pop("script", "t.py")
    with pytest.raises(SpecError):
        JobSpec(script, **kwargs)


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n\r"), max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(setup=st.lists(_text, max_size=3), args=st.lists(_text, max_size=4), name=_text)
def test_printed_equals_written_property(runner, tmp_path, setup, args, name):
    """Whatever the values: the script printed by render and --dry-run is the one render -o writes (or the
    values are refused, the same way, by all three)."""
    opts = [a for line in setup for a in ("--setup", line)] + ["--job-name", name]
    out = tmp_path / "out.sh"
    printed = runner.invoke(cli, ["render", *opts, "train.py", "--", *args])
    dry = runner.invoke(cli, ["submit", "--dry-run", *opts, "train.py", "--", *args])
    written = runner.invoke(cli, ["render", "-o", str(out), *opts, "train.py", "--", *args])
    assert printed.exit_code == dry.exit_code == written.exit_code
    if printed.exit_code == 0:
        assert printed.stdout == dry.stdout == out.read_bytes().decode("utf-8")
    else:
        assert printed.stderr == dry.stderr == written.stderr


@settings(max_examples=200, deadline=None)
@given(depth=st.integers(0, 100_000), digits=st.integers(1, 5000), junk=st.binary(max_size=64))
def test_json_from_files_others_write_is_data_with_bounds(depth, digits, junk):
    """Issue 58: datafiles.parse_json, the one reader of JSON that jobs or other machines write: nesting, huge
    integers and bytes that are not JSON are each a ValueError that says what, never a RecursionError or a slow
    conversion; what is within the bounds reads as json.loads reads it."""
    from clusterddp.datafiles import MAX_DEPTH, MAX_INT_DIGITS, parse_json

    for text in ("[" * depth + "1" + "]" * depth, '{"a": ' * depth + "1" + "}" * depth):
        if depth <= MAX_DEPTH:
            assert parse_json(text) == json.loads(text)
        else:
            with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH}"):
                parse_json(text)
    number = "7" * digits
    if digits <= MAX_INT_DIGITS:
        assert parse_json(f"[{number}, -{number}]") == [int(number), -int(number)]
    else:
        with pytest.raises(ValueError, match=f"an integer of {digits} digits"):
            parse_json(f'{{"step": {number}}}')
    try:
        parse_json(junk)
    except ValueError:
        pass
