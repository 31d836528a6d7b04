import dataclasses

import pytest

from clusterddp import JobSpec, SpecError
from clusterddp.job.spec import parse_env, parse_time, sbatch_quote


@pytest.mark.parametrize("text,seconds", [
    ("90", 90 * 60), ("05:30", 5 * 60 + 30), ("02:00:00", 7200), ("1-12", 36 * 3600),
    ("1-12:30", 36 * 3600 + 1800), ("2-00:00:05", 2 * 86400 + 5), ("UNLIMITED", 0), ("125:00", 125 * 60),
])
def test_every_slurm_time_format(text, seconds):
    assert parse_time(text) == seconds
    assert JobSpec("t.py", time=text).time_seconds == seconds


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "1-25", "00:61", "10:00:60", "-5", "0", "00:00:00", "1-"])
def test_malformed_time_names_formats(text):
    with pytest.raises(SpecError, match="expected MM, MM:SS|must be|below"):
        parse_time(text)


def test_world_size_gpus_and_cpu_only():
    assert JobSpec("t.py", nodes=2, gpus_per_node=8).world_size == 16
    cpu = JobSpec("t.py", nodes=3, procs_per_node=4)
    assert (cpu.world_size, cpu.dist_backend, cpu.gpus_per_node) == (12, "gloo", 0)
    assert JobSpec("t.py").world_size == 1


def test_tasks_and_cpus_per_launcher():
    t = JobSpec("t.py", nodes=2, gpus_per_node=4, cpus_per_task=8)
    assert (t.slurm_tasks_per_node, t.slurm_cpus_per_task) == (1, 32)
    s = t.replace(launcher="srun")
    assert (s.slurm_tasks_per_node, s.slurm_cpus_per_task) == (4, 8)


@pytest.mark.parametrize("kwargs,message", [
    (dict(nodes=0), "nodes must be at least 1, got 0"),
    (dict(gpus_per_node=-1), "gpus_per_node must be at least 0, got -1"),
    (dict(launcher="torchrn"), "unknown launcher 'torchrn' (did you mean 'torchrun'?)"),
    (dict(gpu_request="gres:gpu"), "unknown gpu_request"),
    (dict(gpus_per_node=2, procs_per_node=3), "conflicting options"),
    (dict(gpu_request="gpus-per-task", gpus_per_node=2), "use it with --launcher srun"),
    (dict(mem="10 GB"), "invalid memory '10 GB'"),
    (dict(job_name="a\nb"), "contains a newline"),
    (dict(partition="gpu\r"), "carriage return"),
    (dict(env=(("1BAD", "x"),)), "invalid environment variable name '1BAD'"),
    (dict(sbatch_args=("-J x",)), "invalid --sbatch-arg"),
    (dict(sbatch_args=("--nodes=4",)), "sets --nodes, which clusterddp computes; use --nodes instead"),
    (dict(master_port=70000), "at most 65535"),
    (dict(output_dir="a\\b"), "backslash"),
    (dict(setup=("module load x\nrm -rf /",)), "setup line"),
])
def test_invalid_specs_say_what_and_how(kwargs, message):
    with pytest.raises(SpecError) as exc:
        JobSpec("t.py", **kwargs)
    assert message in str(exc.value)


def test_spec_is_frozen_and_hashable():
    spec = JobSpec("t.py", args=["a"], env={"A": "1"}, setup=["x"])
    assert spec.args == ("a",) and spec.env == (("A", "1"),)
    hash(spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.nodes = 3  # type: ignore[misc]


def test_module_entry_point_and_default_names():
    assert JobSpec("pkg.train", module=True).job_name == "train"
    assert JobSpec("dir/my train.py").job_name == "my_train"
    with pytest.raises(SpecError, match="invalid module name"):
        JobSpec("pkg/train.py", module=True)


def test_parse_env():
    assert parse_env(["A=1", "B=x=y", "C="]) == (("A", "1"), ("B", "x=y"), ("C", ""))
    with pytest.raises(SpecError, match="has no '='"):
        parse_env(["NOEQUALS"])


@pytest.mark.parametrize("value,encoded", [
    ("plain", "plain"), ("gpu:4", "gpu:4"), ("a b", '"a b"'), ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'), ("x#y", '"x#y"'), ("it's", '"it\'s"'),
])
def test_sbatch_quote(value, encoded):
    assert sbatch_quote(value) == encoded


def test_directives_are_data():
    spec = JobSpec("t.py", nodes=2, gpus_per_node=8, time="1:00:00", exclusive=True, gpu_request="gres",
                   job_name="a/b%c", sbatch_args=("--mail-type=END", "--no-kill"))
    d = dict(spec.sbatch_directives())
    assert d["gres"] == "gpu:8" and d["nodes"] == "2" and d["ntasks-per-node"] == "1"
    assert d["exclusive"] is None and d["no-kill"] is None and d["mail-type"] == "END"
    # the job name never reaches a file path unsanitised
    assert d["output"] == "clusterddp-runs/a_b_c-%j.out"


@pytest.mark.parametrize("raw, expected", [("", 5.0), ("  ", 5.0), ("1", 1.0), ("0.5", 0.5), ("60", 60.0),
                                           (" 2.5 ", 2.5)])
def test_poll_max_accepts_seconds_in_range(raw, expected):
    from clusterddp.job.parse import poll_max

    assert poll_max(raw) == (expected, "")


@pytest.mark.parametrize("raw", ["0.4", "0", "-1", "61", "1e9", "nan", "inf", "soon", "1s", "--help", "$(id)"])
def test_poll_max_refuses_the_rest_with_the_default_and_a_reason(raw):
    from clusterddp.job.parse import poll_max

    value, problem = poll_max(raw)
    assert value == 5.0
    assert problem.startswith(f"CLUSTERDDP_POLL_MAX={raw!r} is not a number of seconds from 0.5 to 60")
