"""clusterddp's torchrun agent (runtime/agent.py): where it waits for node 0's store, and torch's exit-barrier race
(pytorch/pytorch#69520) reproduced with real stores in real processes, then gone."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from clusterddp.runtime.rendezvous import free_port

# One agent's exit barrier, as torch's agent calls it (torch.distributed.elastic.utils.store.barrier, through the
# module's attribute), in a process of its own: node 0's holds the store and ends at once after it, as an agent
# ends; node 1's is slow between its last check-in and its wait (a loaded machine), by a store that waits 0.5 s first.
AGENT = textwrap.dedent("""
    import os, sys, time
    from datetime import timedelta
    import torch.distributed as dist
    from torch.distributed.elastic.utils import store as store_util
    from clusterddp.runtime import agent

    role, port, ours = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "ours"
    store = dist.TCPStore("127.0.0.1", port, 2, role == "0", timedelta(seconds=20))
    if ours:
        agent.hold_exit_barrier([f"--node-rank={role}", "--rdzv-backend=static"])

    class Slow:
        def __init__(self, inner):
            self.__dict__["inner"] = inner
        def __getattr__(self, name):
            return getattr(self.inner, name)
        def wait(self, keys, *rest):
            time.sleep(0.5)
            return self.inner.wait(keys, *rest)

    if role == "1":
        time.sleep(1.0)  # (node 0's agent is in the barrier first: this one is the last member)
    try:
        store_util.barrier(store=Slow(store) if role == "1" else store, world_size=2, key_prefix=agent.TERMINAL,
                           barrier_timeout=20)
        print("through", flush=True)
    except Exception as exc:
        print("error:", type(exc).__name__, flush=True)
    os._exit(0)
""")


def _agents(tmp_path, which: str):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    port = free_port()
    host = subprocess.Popen([sys.executable, str(script), "0", str(port), which], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    other = subprocess.run([sys.executable, str(script), "1", str(port), which], capture_output=True, text=True,
                           timeout=120)
    out, err = host.communicate(timeout=120)
    return out.strip(), other.stdout.strip(), other.stderr


def test_node_0_s_agent_leaves_torch_s_exit_barrier_last(tmp_path):
    """With torch's barrier alone, node 0's agent ends while node 1's still waits on its store: the error torchrun logs
    as "Error waiting on exit barrier" (with c10d's C++ stack); held, both are through and nothing is said."""
    host, other, said = _agents(tmp_path, "torch")
    assert host == "through" and other.startswith("error: DistNetworkError"), (host, other, said)
    host, other, said = _agents(tmp_path, "ours")
    assert (host, other) == ("through", "through") and "TCPStore" not in said, (host, other, said)


def test_an_agent_past_node_0_waits_for_node_0_s_store_and_node_0_s_agent_does_not(monkeypatch):
    """(agent.await_master: the master's address and port from torchrun's own options, never the script's)"""
    from clusterddp.runtime import agent, rendezvous

    waited = []
    monkeypatch.setattr(rendezvous, "await_store", lambda *args: waited.append(args))
    argv = ["--nnodes=2", "--rdzv-backend=static", "--master-addr=node1", "--master-port=29512",
            "--module", "clusterddp.runtime.warmrun", "train.py", "--master-port=1"]
    for node_rank, expected in (("1", [("node1", 29512, 60)]), ("0", []), (None, [])):
        waited.clear()
        if node_rank is None:
            monkeypatch.delenv("PET_NODE_RANK", raising=False)
        else:
            monkeypatch.setenv("PET_NODE_RANK", node_rank)
        agent.await_master(argv)
        assert waited == expected, (node_rank, waited)
    monkeypatch.setenv("PET_NODE_RANK", "1")  # (torchrun's own --node-rank wins over the variable; _ spellings too)
    waited.clear()
    agent.await_master(["--node_rank=0", *argv])
    assert waited == []
    agent.await_master(["--master_addr=node3", *argv])
    assert waited == [("node3", 29512, 60)]


def test_the_barrier_is_left_as_torch_has_it_where_node_0_need_not_hold_the_store(monkeypatch):
    """c10d's rendezvous (or --standalone) puts the store on whichever agent: nothing is held there."""
    from torch.distributed.elastic.utils import store as store_util

    from clusterddp.runtime import agent

    torch_s = store_util.barrier
    for argv in (["--rdzv-backend=c10d", "--node-rank=0"], ["--standalone"], ["--rdzv_backend=etcd"]):
        agent.hold_exit_barrier(argv)
        assert store_util.barrier is torch_s, argv
    monkeypatch.setattr(store_util, "barrier", torch_s)  # (restored after the patch below)
    agent.hold_exit_barrier(["--node-rank=1"])
    assert store_util.barrier is not torch_s


def test_a_python_without_torch_runs_the_torchrun_on_path_with_the_same_arguments(tmp_path):
    """The job's python has clusterddp (the supervisor needs it) but torch may come from another interpreter's
    torchrun on PATH (a site module): the agent then is that torchrun, as before; with none, one clear line."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch in this python')\n")
    (tmp_path / "bin").mkdir()
    standin = tmp_path / "bin" / "torchrun"
    standin.write_text('#!/bin/sh\necho "torchrun $*"\n')
    standin.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{root}", PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin")
    argv = [sys.executable, "-m", "clusterddp.runtime.agent", "--nnodes=2", "--node-rank=1", "train.py", "--lr", "1"]
    ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout == "torchrun --nnodes=2 --node-rank=1 train.py --lr 1\n", ran
    standin.unlink()
    ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 1 and "cannot import torch, and there is no torchrun on PATH" in ran.stderr, ran
    assert "Traceback" not in ran.stderr
