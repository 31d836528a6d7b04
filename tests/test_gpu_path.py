"""Issue 28: the CUDA/NCCL path, pinned down on the CPU where the behaviour is logic (``../shared/gpu-desk-check.md``
numbers in each test). What only a GPU can show is in ``make gpu-check`` (bench/gpu_check.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp import contract
from clusterddp.backends.local.plan import make_plan
from clusterddp.backends.local.run import run_plan
from clusterddp.backends.slurm.script import render
from clusterddp.job.spec import JobSpec

from .conftest import ROOT


def _exports(script: str, name: str) -> list:
    return [line for line in script.splitlines() if line.startswith(f"export {name}=")]


def test_a_users_nccl_settings_win_in_both_backends(tmp_path):
    """Desk check 2: -e TORCH_NCCL_... is kept by the batch script (it was overwritten later in the script) and by
    --local, from the one FLIGHT_RECORDER table; the other settings stay."""
    spec = JobSpec("t.py", nodes=2, gpus_per_node=4, env=(("TORCH_NCCL_TRACE_BUFFER_SIZE", "20000"),
                                                            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")))
    script = render(spec)
    assert _exports(script, "TORCH_NCCL_TRACE_BUFFER_SIZE") == ["export TORCH_NCCL_TRACE_BUFFER_SIZE=20000"]
    assert _exports(script, "TORCH_NCCL_ASYNC_ERROR_HANDLING") == ["export TORCH_NCCL_ASYNC_ERROR_HANDLING=1"]
    assert _exports(script, "TORCH_NCCL_DUMP_ON_TIMEOUT") == ["export TORCH_NCCL_DUMP_ON_TIMEOUT=1"]
    assert _exports(script, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE") == [
        'export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$RUN_DIR/nccl-trace/rank_"']
    plan = make_plan(JobSpec("t.py", nodes=1, gpus_per_node=2, env=spec.env), str(tmp_path), 20001, 1, ["0", "1"])
    common = [pair for pair in plan.common if pair[0].startswith("TORCH_NCCL_")]
    assert dict(common) == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "20000", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "nccl-trace" / "rank_")}
    assert len(common) == 4  # each once
    off = render(JobSpec("t.py", nodes=2, gpus_per_node=4, flight_recorder=False))
    assert "TORCH_NCCL" not in off


@pytest.mark.ranks
def test_a_local_gpu_run_makes_the_dump_directory(tmp_path):
    """Desk check 3: torch opens RUN_DIR/nccl-trace/rank_N without making the directory; --local makes it."""
    (tmp_path / "t.py").write_text("print('ran')\n")
    spec = JobSpec(str(tmp_path / "t.py"), nodes=1, gpus_per_node=1, output_dir=str(tmp_path / "runs"))
    run_dir = tmp_path / "runs" / "run"
    plan = make_plan(spec, str(run_dir), 20002, 1, ["0"])
    assert dict(plan.common)["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(run_dir / contract.NCCL_TRACE_DIR / "rank_")
    assert run_plan(plan, quiet=True, echo=lambda _: None, note=lambda _: None) == 0
    assert (run_dir / contract.NCCL_TRACE_DIR).is_dir()


def test_a_cpu_job_is_kept_off_the_gpus():
    """Desk check 10: --gpus 0 hides the node's GPUs from the job (-e still decides), and the runtime takes the CPU
    and gloo from CLUSTERDDP_GPUS_PER_NODE=0 without asking CUDA at all."""
    script = render(JobSpec("t.py", nodes=2, gpus_per_node=0, procs_per_node=4))
    assert _exports(script, "CUDA_VISIBLE_DEVICES") == ["export CUDA_VISIBLE_DEVICES="]
    assert not _exports(render(JobSpec("t.py", nodes=2, gpus_per_node=4)), "CUDA_VISIBLE_DEVICES")
    given = render(JobSpec("t.py", gpus_per_node=0, env=(("CUDA_VISIBLE_DEVICES", "3"),)))
    assert _exports(given, "CUDA_VISIBLE_DEVICES")[-1] == "export CUDA_VISIBLE_DEVICES=3"  # the user's, later


RUNTIME = r'''
import sys, torch
from clusterddp import runtime
from clusterddp.errors import RuntimeEnvError
from clusterddp.runtime import group
from clusterddp.runtime.env import DistEnv

what = sys.argv[1]
if what == "cpu-job":
    def no_cuda():
        raise AssertionError("CUDA was asked")
    torch.cuda.is_available = no_cuda
    env = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 0, "single")
    print("device", group._job_device(env, {"CLUSTERDDP_GPUS_PER_NODE": "0"}))
    sys.exit(0)
runtime.init(allow_single=True)
if what == "sparse":
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Flatten(), torch.nn.Linear(8, 1))
    wrapped = runtime.wrap(model)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    wrapped(torch.tensor([[1, 2]])).sum().backward()
    opt.step()
    print("sparse ok", wrapped.module[0].weight.grad.is_sparse)
elif what == "static":
    wrapped = runtime.wrap(torch.nn.Linear(3, 1))
    try:
        wrapped._set_static_graph()
    except RuntimeEnvError as exc:
        print("refused:", exc)
    print("static ok", runtime.wrap(torch.nn.Linear(3, 1), static_graph=True).static_graph)
elif what == "device-ids":
    from torch.nn.parallel import DistributedDataParallel as DDP
    kwargs = group.ddp_arguments(torch.device("cuda", 3), {"device_ids": None})
    DDP(torch.nn.Linear(3, 1), **kwargs)  # DDP refused output_device=3 without device ids
    print("device-ids ok", kwargs, group.ddp_arguments(torch.device("cuda", 3), {}),
          group.ddp_arguments(torch.device("cpu"), {}))
runtime.shutdown()
'''


def _runtime(tmp_path: Path, what: str) -> str:
    script = tmp_path / "runtime_check.py"
    script.write_text(RUNTIME)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), what], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.ranks
def test_wrap_with_sparse_gradients(tmp_path):
    """Desk check 5: wrap() raised "Expected variable to have sparse gradient" (its zero backward gave the
    embedding a dense gradient); now the layout step is left out for such models, and it says what that costs."""
    out = _runtime(tmp_path, "sparse")
    assert "sparse ok True" in out and "sparse gradients (nn.Embedding(sparse=True))" in out


def test_sparse_gradients_on_nccl_are_refused_before_anything_is_built():
    """make gpu-check on an H100 (torch 2.11): NCCL cannot all-reduce sparse tensors, so the first backward failed
    on every rank with torch's message. wrap() now refuses such a model on NCCL, naming the modules and what to do;
    gloo (which all-reduces them) and dense models pass."""
    import torch

    from clusterddp.errors import RuntimeEnvError
    from clusterddp.runtime.group import sparse_on_nccl

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Flatten(),
                                torch.nn.EmbeddingBag(10, 4, sparse=True), torch.nn.Embedding(10, 4))
    with pytest.raises(RuntimeEnvError) as caught:
        sparse_on_nccl("nccl", model)
    text = str(caught.value)
    assert "'0', '2' have sparse gradients" in text and "NCCL cannot all-reduce sparse" in text
    assert "sparse=False" in text and "--gpus 0" in text and "'3'" not in text
    with pytest.raises(RuntimeEnvError, match="'Embedding' has sparse"):
        sparse_on_nccl("nccl", torch.nn.Embedding(10, 4, sparse=True))
    sparse_on_nccl("gloo", model)
    sparse_on_nccl(None, model)
    sparse_on_nccl("nccl", torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 1)))
    frozen = torch.nn.Embedding(10, 4, sparse=True).requires_grad_(False)  # (no gradient: nothing to all-reduce)
    sparse_on_nccl("nccl", torch.nn.Sequential(frozen, torch.nn.Linear(4, 1)))


@pytest.mark.ranks
def test_set_static_graph_after_wrap_says_what_to_do(tmp_path):
    """Desk check 7: torch's own error named the training loop; ours names the keyword that works."""
    out = _runtime(tmp_path, "static")
    assert "refused: _set_static_graph() after runtime.wrap()" in out and "static_graph=True" in out
    assert "static ok True" in out


@pytest.mark.ranks
def test_device_ids_none_is_passed_on_without_an_output_device(tmp_path):
    """Desk check 6: device_ids=None with the default output_device=<index> raised on every rank but those on
    cuda:0 (a rank-dependent failure); the real DDP constructor accepts what wrap() now passes."""
    out = _runtime(tmp_path, "device-ids")
    assert ("device-ids ok {'device_ids': None} {'device_ids': [3], 'output_device': 3} {}") in out


@pytest.mark.ranks
def test_a_cpu_job_never_asks_cuda(tmp_path):
    assert "device cpu" in _runtime(tmp_path, "cpu-job")


def test_cuda_random_state_is_this_ranks_own_device(monkeypatch):
    """Desk check 4: one CUDA random state per rank, saved from and restored to the rank's own device (a list of
    every visible GPU restored by position broke when the layout changed); a checkpoint in the old list form
    restores the rest and says the CUDA states were not restored."""
    import torch

    from clusterddp.runtime import ckptstate
    from clusterddp.runtime import state as runtime_state

    calls = []
    state = torch.arange(16, dtype=torch.uint8)
    monkeypatch.setattr(runtime_state, "STATE",
                        {**runtime_state.STATE, "env": object(), "device": torch.device("cuda", 3)})
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda dev: calls.append(("get", dev)) or state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, dev: calls.append(("set", dev, s.tolist())))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: pytest.fail("every visible GPU's state"))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: pytest.fail("restored by position"))
    saved = ckptstate.saved_rng(ckptstate.rng_state())
    assert calls == [("get", torch.device("cuda", 3))] and saved["cuda"].tolist() == list(range(16))
    ckptstate.set_rng_state(saved)
    assert calls[-1] == ("set", torch.device("cuda", 3), list(range(16)))
    notes = []
    monkeypatch.setattr(ckptstate, "print0", notes.append)
    ckptstate.set_rng_state({**saved, "cuda": [state, state]})
    assert len(calls) == 2 and "CUDA random states not restored" in notes[0]
    monkeypatch.setattr(runtime_state, "STATE", {**runtime_state.STATE, "device": torch.device("cpu")})
    assert "cuda" not in ckptstate.rng_state()  # a CPU rank keeps none


def test_dp_vs_ddp_runs_autocast_inside_each_replicas_thread():
    """Desk check 8: nn.DataParallel calls every replica's forward in a thread of its own, and autocast's dtype is
    per thread: an autocast around the step did not reach them as bf16. The example's Autocast module enters it
    inside forward: a forward in another thread (as DataParallel's) computes in bf16; the old way did not."""
    import threading

    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from dp_vs_ddp import Autocast
    finally:
        sys.path.remove(str(ROOT / "examples"))
    linear, x, seen = torch.nn.Linear(4, 4), torch.randn(2, 4), {}

    def in_a_thread(name, model):
        t = threading.Thread(target=lambda: seen.__setitem__(name, model(x).dtype))
        t.start()
        t.join()

    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        in_a_thread("around the step", linear)
    in_a_thread("inside forward", Autocast(linear, "cpu", True))
    assert seen == {"around the step": torch.float32, "inside forward": torch.bfloat16}


def test_gpu_check_uses_only_the_gpus_it_was_given(monkeypatch):
    """Desk check 9: the mask check ran on physical GPUs 0..n-1, whatever CUDA_VISIBLE_DEVICES said."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_desk
    finally:
        sys.path.remove(str(ROOT / "bench"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5, 6,7")
    assert gpu_desk.visible(4) == ["4", "5", "6", "7"] and gpu_desk.visible(2) == ["4", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_desk.visible(3) == ["0", "1", "2"]


def test_device_selection_follows_what_the_task_sees(monkeypatch):
    """README "Device selection": cuda:LOCAL_RANK when a task sees its node's GPUs, cuda:0 when it sees one, an
    out-of-range local rank an error naming CUDA_VISIBLE_DEVICES, the CPU without CUDA (torch's CUDA calls faked:
    the logic, on the CPU; make gpu-check runs it on GPUs)."""
    import torch

    from clusterddp.errors import RuntimeEnvError
    from clusterddp.runtime.env import DistEnv
    from clusterddp.runtime.group import select_device

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")

    def env(local_rank: int) -> DistEnv:
        return DistEnv(4 + local_rank, local_rank, 8, 4, 1, 2, "node1", 20000, "srun")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert select_device(env(3)) == torch.device("cpu") and chosen == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert select_device(env(3)) == torch.device("cuda", 3) and chosen == [3]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # --gpus-per-task: each task sees its own as 0
    assert select_device(env(3)) == torch.device("cuda", 0) and chosen == [3, 0]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(RuntimeEnvError, match=r"local rank 3 has no GPU: this task sees 2 GPUs "
                                              r"\(CUDA_VISIBLE_DEVICES='4,5'\) for 4 ranks per node"):
        select_device(env(3))


def test_a_job_that_asked_for_gpus_where_torch_sees_none_says_so_once(monkeypatch, capsys):
    """README "--gpus 0" paragraph: rank 0 of a job that asked for GPUs, where torch sees none, says so in one line
    and trains on the CPU; the other ranks and a --local run say nothing; --gpus 0 never asks CUDA."""
    import torch

    from clusterddp.runtime.env import DistEnv
    from clusterddp.runtime.group import _job_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rank0, rank1 = (DistEnv(r, r, 2, 2, 0, 1, "node1", 20000, "srun") for r in (0, 1))
    asked = {contract.GPUS_PER_NODE: "2"}
    assert _job_device(rank0, asked) == torch.device("cpu")
    said = capsys.readouterr().out
    assert said.count("\n") == 1
    assert "this job asked for 2 GPU(s) per node, but torch sees no usable CUDA device" in said
    assert "training on the CPU with gloo" in said
    assert _job_device(rank1, asked) == torch.device("cpu") and capsys.readouterr().out == ""
    assert _job_device(rank0, {**asked, contract.LOCAL: "1"}) == torch.device("cpu") and not capsys.readouterr().out

    def no_cuda_please() -> bool:
        raise AssertionError("a --gpus 0 job asked CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda_please)
    assert _job_device(rank0, {contract.GPUS_PER_NODE: "0"}) == torch.device("cpu")
