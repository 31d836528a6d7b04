"""No user value, environment variable or shared file can run code, add an sbatch option or act for someone else.

Every class of hostile input on the rendered script (run under bash with stand-in launchers); the same classes through
the real sbatch of the test cluster are in test_security_slurm.py.
"""
from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp import JobSpec, SpecError
from clusterddp.api import executor_params, setup_lines
from clusterddp.backends.slurm.script import context, render
from clusterddp.cli import cli
from clusterddp.job.sbatch_options import resolve

from .cases import CORPUS, has_control, run_rendered
from .conftest import cli_runner

RECORDER = Path(__file__).parent / "scripts" / "record_argv.py"


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".git").mkdir()  # the project root: the profile search stops here
    (tmp_path / "train.py").write_text(RECORDER.read_text())
    return cli_runner()


def one_line_usage_error(r) -> str:
    """A refusal: exit code 2, one line on stderr, no traceback, nothing on stdout."""
    assert r.exit_code == 2, (r.exit_code, r.stdout[:300], r.stderr[:300])
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("clusterddp: error: "), r.stderr[:500]
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.stderr and r.stdout == ""
    return r.stderr


# --- 1. sbatch's own argv ----------------------------------------------------------------------------------
def test_script_path_reaches_sbatch_after_double_dash_absolute(tmp_path):
    from clusterddp.backends.slurm.commands import script_argv

    argv = script_argv(Path("--wrap=touch PWNED;echo ") / "job.sbatch", remote=False)
    assert argv[-2] == "--" and argv[-1].startswith("/") and "--ignore-pbs" in argv[:-2]


@pytest.mark.parametrize("source", ["cli", "env", "profile"])
def test_output_dir_that_looks_like_an_option_stays_a_directory(runner, tmp_path, source):
    value = "--wrap=touch PWNED;echo "
    args, env = ["render", "train.py"], {}
    if source == "cli":
        args[1:1] = ["--output-dir", value]
    elif source == "env":
        env["CLUSTERDDP_OUTPUT_DIR"] = value
    else:
        (tmp_path / "clusterddp.toml").write_text('[defaults]\noutput_dir = "--wrap=touch PWNED;echo "\n')
    r = runner.invoke(cli, args, env=env)
    assert r.exit_code == 0, r.stderr
    assert '#SBATCH --output="./--wrap=touch PWNED;echo /train-%j.out"' in r.stdout
    assert "RUN_DIR='./--wrap=touch PWNED;echo '/train-\"$SLURM_JOB_ID\"" in r.stdout
    assert (tmp_path / "--wrap=touch PWNED;echo ").is_dir()  # render made the log directory, nothing else


def test_script_path_that_looks_like_an_option_is_a_path(tmp_path):
    (tmp_path / "-x.py").write_text(RECORDER.read_text())
    for launcher in ("srun", "torchrun", "spawn"):
        spec = JobSpec("-x.py", args=("a",), launcher=launcher)
        assert spec.script == "./-x.py"
        assert run_rendered(spec, tmp_path)["argv"] == ["a"]


# --- 2. no user text starts a line --------------------------------------------------------------------------
@pytest.mark.parametrize("launcher", ["torchrun", "srun", "spawn"])
def test_line_breaks_in_values_never_start_a_line(tmp_path, launcher):
    (tmp_path / "r.py").write_text(RECORDER.read_text())
    pbs = "NOTE=x\n#PBS -N other -o /any/path #"
    values = [pbs, "x\r\n#BSUB -J evil", "a\rb", "\x0b\x0c\x1b[0m"]
    spec = JobSpec("r.py", args=tuple(values), env=tuple((f"V{i}", v) for i, v in enumerate(values)),
                   launcher=launcher)
    text = render(spec)
    assert "\r" not in text
    assert not [line for line in text.split("\n") if line.startswith(("#PBS", "#BSUB", "NOTE", "#SBATCH -N"))]
    assert text.startswith("#!/bin/bash\n#SBATCH --ignore-pbs\n")
    got = run_rendered(spec, tmp_path, env_names=[f"V{i}" for i in range(len(values))])
    assert got["argv"] == values and list(got["env"].values()) == values
    # The Python API's batch lines follow the same rule.
    lines = setup_lines(JobSpec(env=(("V", pbs),), launcher="srun"))
    assert not [line for line in lines if line.startswith("#PBS")] and all("\n" not in line for line in lines)


def test_setup_lines_are_code_but_one_line_each():
    with pytest.raises(SpecError, match="setup line .* contains a newline"):
        JobSpec("t.py", setup=("module load x\n#PBS -N evil",))
    with pytest.raises(SpecError, match="carriage return"):
        JobSpec("t.py", setup=("echo x\r",))
    assert "\tmodule load cuda" in render(JobSpec("t.py", setup=("\tmodule load cuda",)))  # tabs are code


# --- 3. names the script relies on, and Slurm's variables as data ------------------------------------------
RESERVED = ["SLURM_JOB_ID", "SLURM_RESTART_COUNT", "SBATCH_PARTITION", "SRUN_CPUS_PER_TASK", "CLUSTERDDP_RUN_DIR",
            "CLUSTERDDP_TIMER_PID", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
            "LOCAL_WORLD_SIZE", "NODE_RANK", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "IFS", "PET_NNODES",
            "TORCHELASTIC_RUN_ID", "EUID", "UID", "PPID", "BASH_FUNC_x%%", "RUN_DIR"]


@pytest.mark.parametrize("name", RESERVED)
def test_reserved_environment_names_are_refused(runner, tmp_path, name):
    r = runner.invoke(cli, ["render", "-e", f"{name}=PWD[$(touch pwned)]", "train.py"])
    message = one_line_usage_error(r)
    assert name in message
    (tmp_path / "clusterddp.toml").write_text(f'[defaults]\nenv = {{ "{name}" = "1" }}\n')
    one_line_usage_error(runner.invoke(cli, ["render", "train.py"]))
    assert not (tmp_path / "pwned").exists()


def test_ordinary_environment_names_still_work():
    spec = JobSpec("t.py", env=(("NCCL_DEBUG", "INFO"), ("OMP_NUM_THREADS", "4"), ("PATH", "/opt/bin:/usr/bin"),
                                ("PYTHONPATH", "src"), ("SLURMISH", "1")))
    assert "export OMP_NUM_THREADS=4\n" in render(spec)


@pytest.mark.parametrize("variable,value", [
    ("SLURM_JOB_ID", "PWD[$(touch pwned)]"), ("SLURM_JOB_ID", "/../.."), ("SLURM_JOB_ID", ""),
    ("SLURM_RESTART_COUNT", "PWD[$(touch pwned)]"), ("SLURM_RESTART_COUNT", "1-1"),
])
def test_slurm_variables_are_checked_before_arithmetic_or_paths(tmp_path, variable, value):
    (tmp_path / "r.py").write_text(RECORDER.read_text())
    proc = run_rendered(JobSpec("r.py", time="10", launcher="srun"), tmp_path, extra_env={variable: value},
                        expect_ok=False)
    assert proc.returncode == 1 and f"clusterddp: {variable}=" in proc.stderr, proc.stderr
    assert not (tmp_path / "record.json").exists() and not list(tmp_path.glob("clusterddp-runs/*"))


def test_leading_zeros_in_the_job_id_are_decimal(tmp_path):
    (tmp_path / "r.py").write_text(RECORDER.read_text())
    got = run_rendered(JobSpec("r.py", launcher="srun"), tmp_path, env_names=["MASTER_PORT"],
                       extra_env={"SLURM_JOB_ID": "0089"})
    assert got["env"]["MASTER_PORT"] == "20089"


def test_inherited_script_variables_do_not_steer_the_script(tmp_path):
    """An inherited CLUSTERDDP_TIMER_PID made the script kill an unrelated process; a stale stop file stopped ranks."""
    (tmp_path / "r.py").write_text(RECORDER.read_text())
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        got = run_rendered(JobSpec("r.py", time="10", launcher="srun"), tmp_path, env_names=["CLUSTERDDP_STOP_FILE"],
                           extra_env={"CLUSTERDDP_TIMER_PID": str(bystander.pid), "CLUSTERDDP_SRUN_PID": "1",
                                      "CLUSTERDDP_STOP_FILE": "/tmp/elsewhere"})
        time.sleep(0.2)
        assert bystander.poll() is None, "the script killed a process it did not start"
        assert got["env"]["CLUSTERDDP_STOP_FILE"].endswith("/stop-requested-0")
        got = run_rendered(JobSpec("r.py", launcher="srun"), tmp_path, env_names=["CLUSTERDDP_STOP_FILE"],
                           extra_env={"CLUSTERDDP_STOP_FILE": "/tmp/elsewhere"})
        assert got["env"]["CLUSTERDDP_STOP_FILE"] is None
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()


# --- 5. --sbatch-arg cannot override what clusterddp owns ---------------------------------------------------
@pytest.mark.parametrize("arg,message", [
    ("--out=x.log", "sets --output (sbatch reads --out as --output)"), ("--job=x", "sets --job-name"),
    ("--dep=afterany:1", "sets --dependency"), ("--tasks-per-node=3", "sets --ntasks-per-node"),
    ("--tasks=3", "sets --ntasks-per-node"), ("--ntasks-per-core=1", "sets --ntasks-per-core"),
    ("--gpus=2", "sets --gpus"), ("--gpus-per-n=2", "sets --gpus-per-node"), ("--chdir=/", "sets --chdir"),
    ("--wrap=touch pwned", "sets --wrap"), ("--time=5", "sets --time"), ("--no-requeue", "sets --no-requeue"),
    ("--cluster=other", "sets --clusters"), ("--err=e.log", "sets --error"), ("--sig=USR1@60", "sets --signal"),
    ("--parsable", "sets --parsable"), ("--wait", "sets --wait"), ("--w=x", "sets --wait"),
    ("--mail=x", "ambiguous"), ("--mail-type", "needs a value"), ("--hold=1", "takes no value"),
    ("--ignore-pbs", "clusterddp always sets it"),
    # Slurm 24.11: --tres-per-task sets per-task GPUs and CPUs; --ext is --extra-node-info on 22.05 only (24.11
    # adds --extra, 26.05 --external).
    ("--tres-per-task=gres/gpu:1", "sets --tres-per-task"), ("--tres-per=cpu:2", "sets --tres-per-task"),
    ("--ext=2:4", "ambiguous to sbatch (could be --external, --extra, --extra-node-info)"),
    ("--stepmgr=1", "takes no value"), ("--spread", "ambiguous"), ("--external=1", "takes no value"),
    ("--resources", "needs a value"),
])
def test_sbatch_arg_read_as_sbatch_reads_it(arg, message):
    with pytest.raises(SpecError) as exc:
        JobSpec("t.py", sbatch_args=(arg,))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_sbatch_args_that_are_allowed_are_written_out_in_full():
    assert resolve("--mail-u=me@example.org") == ("mail-user", "me@example.org")
    assert resolve("--hold") == ("hold", None) and resolve("--comment=a b") == ("comment", "a b")
    assert resolve("--some-future-option=1") == ("some-future-option", "1")  # newer releases: passed through
    assert resolve("--segment=2") == ("segment", "2") and resolve("--power=level") == ("power", "level")
    text = render(JobSpec("t.py", sbatch_args=("--mail-u=me@example.org", "--exclusive=user")))
    assert "#SBATCH --mail-user=me@example.org\n" in text and "#SBATCH --exclusive=user\n" in text


# --- 6. words in command position ---------------------------------------------------------------------------
@pytest.mark.parametrize("value,message", [
    ("-c", "starts with '-'"), ("--version", "starts with '-'"), ("~/venv/bin/python", "starts with '~'"),
    ("%1", "starts with '%'"), ("X=1", "NAME=VALUE"), ("LD_PRELOAD=/x.so", "NAME=VALUE"), ("", "must not be empty"),
    ("py\nthon", "newline"),
])
def test_command_words_cannot_be_read_as_something_else(value, message):
    for field in ("python", "apptainer"):
        with pytest.raises(SpecError, match=message):
            JobSpec("t.py", **{field: value})


def test_command_words_are_exact_shell_words(tmp_path):
    for value in ("/opt/my python/bin/python3", "python3.11", "/a=b/python", "it's", "$(id)"):
        spec = JobSpec("t.py", python=value, apptainer=value)
        image = context(spec)["container_prefix"][len("apptainer exec "):-1]
        for word in (context(spec)["python"], image):
            got = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True).stdout
            assert got == value


def test_spawn_placeholders_fill_arguments_only(tmp_path):
    (tmp_path / "{master_addr}.py").write_text(RECORDER.read_text())
    spec = JobSpec("{master_addr}.py", args=("{master_addr}", "{node_rank}"), launcher="spawn")
    assert run_rendered(spec, tmp_path)["argv"] == ["node1", "0"]


@pytest.mark.parametrize("name", ['a""".py', "x\\N{x}.py", 'q"""; import os; os.system("touch pwned") #.py',
                                  "{name}.py", "-dash.py", "it's.py"])
def test_new_cannot_write_code_through_the_file_name(runner, tmp_path, name):
    reference = runner.invoke(cli, ["new", "plain.py"])
    r = runner.invoke(cli, ["new", "--", name])
    assert r.exit_code == 0 and reference.exit_code == 0, r.stderr
    tree = ast.parse((tmp_path / name).read_text())
    plain = ast.parse((tmp_path / "plain.py").read_text())
    assert [ast.dump(n) for n in tree.body[1:]] == [ast.dump(n) for n in plain.body[1:]]  # only the docstring differs
    assert name in ast.get_docstring(tree) or "'" in name
    subprocess.run([sys.executable, "-c", f"import ast; compile(open({str(tmp_path / name)!r}).read(), 'x', 'exec')"],
                   check=True)
    assert not (tmp_path / "pwned").exists()


def test_new_refuses_control_characters(runner):
    one_line_usage_error(runner.invoke(cli, ["new", "a\nb.py"]))


# --- the Python API's #SBATCH lines go through submitit's shell quoting ------------------------------------
def test_api_refuses_what_submitit_would_mangle():
    with pytest.raises(SpecError, match="backslash"):
        executor_params(JobSpec(job_name="a\\b", launcher="srun"))
    assert executor_params(JobSpec(job_name="a b", launcher="srun"))["additional_parameters"]["ignore_pbs"] is True


# --- the corpus through every source, field and launcher: delivered byte for byte, or refused in one line --
def toml_string(value: str) -> str:
    out = []
    for c in value:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 32 or ord(c) == 127:
            out.append("\\u%04x" % ord(c))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


FIELDS = {"job_name": "--job-name", "output_dir": "--output-dir", "python": "--python", "partition": "--partition",
          "account": "--account", "qos": "--qos", "constraint": "--constraint", "apptainer": "--apptainer",
          "container_image": "--container-image"}


def sbatch_decode(line: str) -> str:
    """An #SBATCH value as sbatch reads it (double quotes, backslash escapes); checked against real sbatch in
    test_security_slurm.py."""
    value = line.split("=", 1)[1]
    if not value.startswith('"'):
        return value
    out, i = [], 1
    while value[i] != '"':
        if value[i] == "\\":
            i += 1
        out.append(value[i])
        i += 1
    assert i == len(value) - 1, line
    return "".join(out)


def refused(field: str, value: str) -> bool:
    """The documented refusal rule of each field (docs/reference.md's quoting guarantees), written here apart from
    the code: names and paths hold no control character and are not blank; a path holds no backslash (it would turn
    off sbatch's %j) and no component over 255 bytes; a word bash runs as a command (the interpreter, the apptainer
    image) does not start with '-', '~' or '%' and is not NAME=VALUE; an #SBATCH value is at most 1024 bytes (what
    slurmctld takes; the log path's is the directory's, '%' doubled, and '/train-%j.out')."""
    if has_control(value) or not value.strip():
        return True
    if field in ("job_name", "partition", "account", "qos", "constraint") and len(value.encode()) > 1024:
        return True
    if field == "output_dir":
        log = ("./" + value if value.startswith("-") else value).replace("%", "%%") + "/train-%j.out"
        return "\\" in value or any(len(part.encode()) > 255 for part in value.split("/")) or \
            len(log.encode()) > 1024
    if field in ("python", "apptainer"):
        return value.startswith(("-", "~", "%")) or re.match(r"[A-Za-z_][A-Za-z0-9_]*\+?=", value) is not None
    return False


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_every_field_and_source_delivers_or_refuses(runner, tmp_path, index):
    value = CORPUS[index]
    for field, option in FIELDS.items():
        for source in ("cli", "env", "profile"):
            if source == "env" and "\0" in value:
                continue  # no environment can hold a NUL byte
            (tmp_path / "clusterddp.toml").unlink(missing_ok=True)
            args, env = ["render", "train.py"], {}
            if source == "cli":
                args[1:1] = [option, value]
            elif source == "env":
                env[f"CLUSTERDDP_{field.upper()}"] = value
            else:
                (tmp_path / "clusterddp.toml").write_text(f"[defaults]\n{field} = {toml_string(value)}\n")
            before = sorted(p.name for p in tmp_path.iterdir())
            r = runner.invoke(cli, args, env=env)
            # issue 79: refused exactly where the rule says, both ways (any refusal passed for three fields)
            assert (r.exit_code != 0) == refused(field, value), (field, source, value, r.stderr)
            if r.exit_code != 0:
                one_line_usage_error(r)
                assert sorted(p.name for p in tmp_path.iterdir()) == before, "a refused value wrote something"
                continue
            text = r.stdout
            if field in ("job_name", "partition", "account", "qos", "constraint"):
                line = next(ln for ln in text.split("\n") if ln.startswith(f"#SBATCH --{field.replace('_', '-')}="))
                assert sbatch_decode(line) == value, (field, line)
            elif field == "output_dir":
                line = next(ln for ln in text.split("\n") if ln.startswith("#SBATCH --output="))
                expected = ("./" + value if value.startswith("-") else value).replace("%", "%%")
                assert sbatch_decode(line) == f"{expected}/train-%j.out"
            else:
                spec = JobSpec("train.py", **{field: value})
                word = context(spec)["python" if field == "python" else "container_srun" if
                                     field == "container_image" else "container_prefix"]
                if field == "container_image":
                    word = word.split(" --container-mounts")[0][len("--container-image="):]
                elif field == "apptainer":
                    word = word[len("apptainer exec "):-1]
                got = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True)
                assert got.stdout == value, (field, word)
            assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
            assert "\r" not in text and not [ln for ln in text.split("\n") if ln.startswith(("#PBS", "#BSUB"))]
    # Arguments (CLI only) and environment values (CLI and profile) reach a rank byte for byte.
    launcher = ("torchrun", "srun", "spawn")[index % 3]
    if "\0" in value:
        one_line_usage_error(runner.invoke(cli, ["render", "-e", f"V={value}", "train.py"]))
        one_line_usage_error(runner.invoke(cli, ["render", "train.py", "--", value]))
        return
    arg = value.replace("{", "(") if launcher == "spawn" else value  # placeholders: spawn's documented rule
    spec = JobSpec("train.py", args=(arg, "end"), env=(("V", value),), launcher=launcher)
    got = run_rendered(spec, tmp_path, env_names=["V"])
    assert got["argv"] == [arg, "end"] and got["env"]["V"] == value


# --- 4. profiles from others are not trusted ----------------------------------------------------------------
EVIL = '[defaults]\nsetup = ["touch pwned"]\npython = "/tmp/evil-python"\n'


def test_profile_owned_by_another_user_is_skipped(runner, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    project = tmp_path / "clusterddp.toml"
    project.write_text(EVIL)
    os.chown(project, 4242, -1)
    r = runner.invoke(cli, ["render", "train.py"])
    assert r.exit_code == 0 and "touch pwned" not in r.stdout and "evil-python" not in r.stdout
    assert f"ignored {project}: it is owned by uid 4242, not by you" in r.stderr
    assert f"CLUSTERDDP_TRUST={project}" in r.stderr
    shown = runner.invoke(cli, ["config", "show"])
    assert f"# skipped {project}: it is owned by uid 4242" in shown.stdout and "touch pwned" not in shown.stdout
    # The user's own opt-in.
    for trust in (str(project), f"/elsewhere:{project}", "*"):
        r = runner.invoke(cli, ["render", "train.py"], env={"CLUSTERDDP_TRUST": trust})
        assert "touch pwned" in r.stdout and "ignored" not in r.stderr


@pytest.mark.parametrize("mode,who", [(0o664, "group"), (0o646, "others"), (0o666, "group and others")])
def test_profile_others_can_write_is_skipped(runner, tmp_path, mode, who):
    for path in (tmp_path / "clusterddp.toml", tmp_path / "config" / "clusterddp" / "config.toml"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(EVIL)
        path.chmod(mode)
        r = runner.invoke(cli, ["render", "train.py"])
        assert r.exit_code == 0 and "touch pwned" not in r.stdout
        assert f"ignored {path}: it is writable by {who}" in r.stderr
        path.unlink()


def test_profile_search_stops_at_the_project_root_and_home(runner, tmp_path, monkeypatch):
    (tmp_path / "clusterddp.toml").write_text(EVIL)  # above the project: somebody else's tree
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    (project / "src" / "train.py").write_text("")
    monkeypatch.chdir(project / "src")
    (tmp_path / ".git").rmdir()
    (project / ".git").mkdir()
    assert "touch pwned" not in runner.invoke(cli, ["render", "train.py"]).stdout
    (project / ".git").rmdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert "touch pwned" not in runner.invoke(cli, ["render", "train.py"]).stdout
    (project / "pyproject.toml").unlink()
    monkeypatch.setenv("HOME", str(project))  # no marker at all: $HOME ends the search
    assert "touch pwned" not in runner.invoke(cli, ["render", "train.py"]).stdout
    monkeypatch.setenv("HOME", str(tmp_path))  # the file is inside the project (home) after all
    assert "touch pwned" in runner.invoke(cli, ["render", "train.py"]).stdout


def test_a_drill_s_variables_in_the_submitting_shell_never_reach_a_real_job(tmp_path):
    """Issue 41: CLUSTERDDP_DRILL_* left in the shell (sbatch exports it; a local run inherits it) stopped a real
    job at step 3 with exit 0. The batch script unsets them; a local run drops them (only the drill gives them)."""
    drill = {"CLUSTERDDP_DRILL_STOP_AT": "3", "CLUSTERDDP_DRILL_DIR": str(tmp_path / "drill")}
    (tmp_path / "r.py").write_text(RECORDER.read_text())
    got = run_rendered(JobSpec("r.py", launcher="srun"), tmp_path, env_names=sorted(drill), extra_env=drill)
    assert got["env"] == {name: None for name in drill}, got["env"]
    record = tmp_path / "local.json"
    env = dict(os.environ, **drill, RECORD_FILE=str(record), RECORD_ENV_NAMES=json.dumps(sorted(drill)))
    proc = subprocess.run([sys.executable, "-m", "clusterddp", "submit", "--local", "--launcher", "srun",
                           str(RECORDER)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(record.read_text())["env"] == {name: None for name in drill}


@pytest.mark.skipif(os.getuid() != 0, reason="models another user with chown: needs root")
def test_a_sweep_s_code_snapshot_is_run_only_from_directories_of_the_user_s_own(tmp_path):
    """Issue 41: a sweep's directory and code snapshot in a shared output directory. One someone else made first
    (or one others can write) is refused, before anything runs; a snapshot whose files changed after it was made
    (a train.py swapped in) is refused; the user's own, unchanged, is used as it is; and one below a directory others
    can change (not sticky: they could swap the sweep directory after the check) is refused as a run directory is."""
    from clusterddp.errors import PreflightError
    from clusterddp.job.code import code_hash
    from clusterddp.sweeps.run import snapshot

    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('mine')\n")
    names = ["train.py"]
    code = code_hash(project, names)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o1777)  # like /tmp: everyone may make a directory here
    planted = shared / "sweep-lr" / "code" / code
    planted.mkdir(parents=True)
    (planted / "train.py").write_text("import os; os.system('id')\n")
    os.chown(shared / "sweep-lr", 4242, 4242)
    with pytest.raises(PreflightError, match="belongs to another user"):
        snapshot(project, names, planted)
    os.chown(shared / "sweep-lr", os.getuid(), os.getgid())
    os.chmod(shared / "sweep-lr", 0o777)
    with pytest.raises(PreflightError, match="writable by group"):
        snapshot(project, names, planted)
    os.chmod(shared / "sweep-lr", 0o755)
    with pytest.raises(PreflightError, match="no longer holds the code it was made from"):
        snapshot(project, names, planted)  # its train.py is not the code its name says
    mine = tmp_path / "out" / "sweep-lr" / "code" / code
    assert snapshot(project, names, mine) == mine and (mine / "train.py").read_text() == "print('mine')\n"
    assert snapshot(project, names, mine) == mine  # again: the same code, used as it is
    (mine / "train.py").write_text("print('swapped')\n")
    with pytest.raises(PreflightError, match="no longer holds"):
        snapshot(project, names, mine)
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)
    with pytest.raises(PreflightError, match=f"sweep: the sweep directory {open_parent}/sweep-lr is not yours alone "
                       f"\\({open_parent} above it is writable by group and others, who could swap it\\)"):
        snapshot(project, names, open_parent / "sweep-lr" / "code" / code)


def test_each_drill_gets_a_new_private_directory(tmp_path):
    """Issue 41: two drills in the same second never share a directory, and its name cannot be predicted (nothing
    can be planted where a log will be opened)."""
    from clusterddp.drill import drill_base

    first, second = drill_base(tmp_path / "drills", "train"), drill_base(tmp_path / "drills", "train")
    assert first != second and first.parent == second.parent == tmp_path / "drills"
    assert first.name.startswith("train-2") and len(first.name) > len("train-20261203-120000-") + 4
    assert all(p.stat().st_mode & 0o777 == 0o700 for p in (first, second))


def test_a_group_writable_directory_of_the_user_s_private_group_is_the_user_s_own(tmp_path):
    """Issue 41's whole-path rule and umask-002 systems: a directory writable by the user's private group (its name
    the user's, no other member) is the user's alone; writable by another group it is not."""
    import grp
    import pwd

    from clusterddp.datafiles import NotOwned, own_run_dir

    me = pwd.getpwuid(os.getuid())
    mine = grp.getgrgid(me.pw_gid)
    if mine.gr_name != me.pw_name or set(mine.gr_mem) - {me.pw_name}:
        pytest.skip("this user has no private group")
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o775)
    os.chown(project, -1, me.pw_gid)
    assert own_run_dir(project / "runs" / "t-1").is_dir()
    assert (project / "runs").stat().st_mode & 0o022 == 0  # made without group or other write
    os.chown(project, -1, 65534)
    with pytest.raises(NotOwned, match="above it is writable by group, who could swap it"):
        own_run_dir(project / "runs" / "t-2")
