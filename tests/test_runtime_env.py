"""DistEnv.from_env: a pure function of the environment, one table per launcher."""
import time

import pytest

from clusterddp.errors import RuntimeEnvError
from clusterddp.runtime import DistEnv

TORCHRUN = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
            "MASTER_ADDR": "node1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "77"}
SRUN_TASK = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "4",
             "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[07-08]",
             "SLURM_JOB_ID": "123456", "SLURM_TASKS_PER_NODE": "2(x2)"}
SPAWN = {"CLUSTERDDP_LAUNCHER": "spawn", "LOCAL_RANK": "1", "NODE_RANK": "1", "CLUSTERDDP_NNODES": "2",
         "CLUSTERDDP_PROCS_PER_NODE": "2", "MASTER_ADDR": "node1", "MASTER_PORT": "21234", "CLUSTERDDP_WORLD_SIZE": "4",
         # the spawn launcher runs inside a one-task-per-node srun step:
         "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0",
         "SLURM_JOB_NUM_NODES": "2"}


def test_torchrun():
    assert DistEnv.from_env(TORCHRUN) == DistEnv(5, 1, 8, 4, 1, 2, "node1", 29500, "torchrun")


def test_srun_task_variables():
    env = DistEnv.from_env(SRUN_TASK)
    assert env == DistEnv(3, 1, 4, 2, 1, 2, "gpu07", 20000 + 123456 % 10000, "srun")


def test_srun_step_variables_win_and_master_from_template():
    env = DistEnv.from_env(dict(SRUN_TASK, SLURM_STEP_NUM_TASKS="4", SLURM_STEP_NUM_NODES="2",
                                SLURM_STEP_NODELIST="gpu[09-10]", MASTER_PORT="25000"))
    assert (env.master_addr, env.master_port) == ("gpu09", 25000)


def test_srun_template_variables():
    # what templates/srun.sh.j2 exports per task on top of srun's own
    env = DistEnv.from_env(dict(SRUN_TASK, RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2",
                                NODE_RANK="1", MASTER_ADDR="gpu07", MASTER_PORT="23456", CLUSTERDDP_LAUNCHER="srun"))
    assert env == DistEnv(3, 1, 4, 2, 1, 2, "gpu07", 23456, "srun")


def test_gpus_per_task_narrowing_does_not_change_ranks():
    env = DistEnv.from_env(dict(SRUN_TASK, CUDA_VISIBLE_DEVICES="0"))
    assert env.local_rank == 1  # select_device then uses device 0: the only one this task sees


def test_spawn_values_win_over_the_srun_step_they_run_in():
    assert DistEnv.from_env(SPAWN) == DistEnv(3, 1, 4, 2, 1, 2, "node1", 21234, "spawn")


def test_single_only_when_asked():
    with pytest.raises(RuntimeEnvError, match="no distributed environment found.*allow_single=True"):
        DistEnv.from_env({})
    env = DistEnv.from_env({}, allow_single=True)
    assert (env.rank, env.world_size, env.source) == (0, 1, "single")


def test_batch_shell_is_not_a_rank():
    batch = {k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_ID"}
    with pytest.raises(RuntimeEnvError, match="batch script of Slurm job 123456 without srun: SLURM_NTASKS=4"):
        DistEnv.from_env(batch)


@pytest.mark.parametrize("env,message", [
    (dict(SRUN_TASK, SLURM_NTASKS="5", SLURM_TASKS_PER_NODE="3,2"),
     "SLURM_NTASKS=5 is not a multiple of SLURM_JOB_NUM_NODES=2.*likely --ntasks-per-node does not match the GPUs"),
    (dict(SRUN_TASK, SLURM_TASKS_PER_NODE="3,1"), "nodes run different numbers of tasks"),
    (dict(TORCHRUN, WORLD_SIZE="6"), "WORLD_SIZE=6 is not a multiple of LOCAL_WORLD_SIZE=4"),
    (dict(TORCHRUN, RANK="9"), "inconsistent ranks.*RANK=9"),
    ({k: v for k, v in TORCHRUN.items() if k != "MASTER_PORT"}, "MASTER_PORT not"),
    (dict(TORCHRUN, CLUSTERDDP_WORLD_SIZE="16"),
     "rendered for CLUSTERDDP_WORLD_SIZE=16 ranks.*started 8.*ntasks-per-node does not match GPUs"),
    (dict(SRUN_TASK, SLURM_PROCID="x"), "SLURM_PROCID='x' is not an integer"),
    (dict(SRUN_TASK, SLURM_JOB_NODELIST="gpu[07-"), "cannot take MASTER_ADDR"),
    ({k: v for k, v in SPAWN.items() if k != "NODE_RANK"}, "missing NODE_RANK"),
])
def test_bad_combinations_name_what_was_seen(env, message):
    with pytest.raises(RuntimeEnvError, match=message):
        DistEnv.from_env(env)


def test_shutdown_leaves_no_state_behind():
    """DistEnv is a pure value; the group owns every piece of state, and shutdown() clears all of it (stop
    requests and signal handlers included)."""
    import signal

    from clusterddp import runtime
    from clusterddp.runtime import group

    assert not hasattr(DistEnv, "__exit__")
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    env = runtime.init(allow_single=True, environ={}, timeout=30)
    assert env.world_size == 1 and runtime.should_stop() is False
    assert group.STATE["stop"]["polled"] is True
    runtime.shutdown()
    assert group.STATE == {}
    assert {s: signal.getsignal(s) for s in before} == before
    with runtime.init(allow_single=True, environ={}, timeout=30) as again:
        assert again.rank == 0 and runtime.world_size() == 1
    assert group.STATE == {}


def test_a_counter_that_fails_from_the_first_beat_starts_the_clock_not_a_hang(monkeypatch):
    """CI, submitit job: a short job's rank 0 ended and took the TCP store with it before rank 2's first beat; the
    failed first reading left the watchdog's clock at 0 (the machine's boot) and rank 2 declared a hang of
    17099 s while shutting down (exit 79, no result). The clock starts at the first beat; a stopping thread never
    declares a hang. (A store that fails at once: the error path a real store gives only at teardown.)"""
    import threading
    import time

    from clusterddp import contract
    from clusterddp.runtime import control
    from clusterddp.runtime.env import DistEnv

    class Gone:
        def add(self, key, value):
            raise ConnectionError("Connection was likely closed")

    hung = []
    monkeypatch.setattr(control, "POLL_S", 0.05)
    monkeypatch.setattr(control, "BEAT_S", 0.1)
    monkeypatch.setattr(control.Control, "_hung", lambda self, idle, limit: hung.append((idle, limit)))
    env = DistEnv(2, 0, 4, 2, 1, 2, "node1", 20001, "srun")
    watch = control.Control(env, None, 60.0, {contract.HANG_TIMEOUT: "1"})
    watch.start()
    watch.joined(Gone())
    time.sleep(1.0)  # the limit before the first step is 2 s: nothing yet
    assert hung == [], hung
    time.sleep(1.6)  # past it: the watchdog still acts (a broken counter never turns it off)
    assert hung and 1.9 < hung[0][0] < 3.5 and hung[0][1] == 2.0, hung
    count = len(hung)
    watch.stopping.set()
    time.sleep(0.3)
    watch.thread.join(timeout=5)
    assert not watch.thread.is_alive() and len(hung) <= count + 1 and threading.active_count() >= 1


def test_set_up_collectives_leave_the_start_up_window_open_until_the_first_step_ends(monkeypatch):
    """CI (stop 63, loaded machine): the ranks met in all_reduce_mean, then runtime.wrap took over 20 s; that
    all-reduce had ended the doubled start-up limit, so the watchdog called a slow DDP set-up a hang. Set-up
    collectives are progress but the limit stays doubled until the rank's first step ends (a second batch)."""
    import time
    from datetime import timedelta

    from torch.distributed import TCPStore

    from clusterddp import contract
    from clusterddp.runtime import control
    from clusterddp.runtime.env import DistEnv

    monkeypatch.setattr(control, "POLL_S", 0.05)
    monkeypatch.setattr(control, "BEAT_S", 0.1)
    store = TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    env = DistEnv(2, 0, 4, 2, 1, 2, "node1", store.port, "srun")

    def limit_after(beats):
        monkeypatch.setattr(control, "_BEATS", [0, 0, 0, 0, 0])
        hung = []
        monkeypatch.setattr(control.Control, "_hung", lambda self, idle, limit: hung.append((idle, limit)))
        watch = control.Control(env, None, 60.0, {contract.HANG_TIMEOUT: "1"})
        watch.start()
        watch.joined(store)
        for source in beats:  # each beat seen by the watchdog (one reading of the counter per BEAT_S)
            control.heartbeat(source)
            time.sleep(0.25)
        deadline = time.monotonic() + 5
        while not hung and time.monotonic() < deadline:
            time.sleep(0.05)
        watch.stopping.set()
        watch.thread.join(timeout=5)
        assert hung, beats
        return hung[0][1]

    assert limit_after(["setup"] * 4) == 2.0  # all_reduce_mean, barrier: the first step has not ended
    assert limit_after(["batch"]) == 2.0      # the first batch is handed out: its step runs
    assert limit_after(["setup", "batch", "batch"]) == 1.0  # the second batch: the first step's body ran
    assert limit_after(["stop"]) == 2.0  # (a loop may ask should_stop() before its first step's work)
    assert limit_after(["stop", "forward", "stop"]) == 1.0  # the second should_stop(): a step ended
    assert limit_after(["user", "user"]) == 1.0     # a loop of the user's own that calls heartbeat()


def test_after_a_hang_no_rank_exits_before_every_rank_that_answered_has_kept_its_state(tmp_path, monkeypatch):
    """Issue 55, CI on Slurm 22.05: the first rank to exit ends the step (srun --kill-on-bad-exit), and a survivor
    whose watchdog fired 2 s later was still writing its state at the SIGKILL (KillWait): the retry resumed from the
    checkpoint. Each rank now marks its state kept and waits (bounded) for the marks of every rank that answered."""
    import threading
    import time

    from clusterddp import contract
    from clusterddp.runtime import control
    from clusterddp.runtime.env import DistEnv

    def watcher(rank: int) -> "control.Control":
        watch = control.Control(DistEnv(rank, rank, 2, 2, 0, 1, "node1", 20001, "srun"), str(tmp_path), 60.0, {})
        watch.answered = {0, 1}
        return watch

    first, second = watcher(0), watcher(1)
    (tmp_path / contract.HANG_DIR.format(restarts=0)).mkdir(parents=True)
    done = []
    waiting = threading.Thread(target=lambda: (first.wait_all_kept(), done.append(time.monotonic())))
    begun = time.monotonic()
    waiting.start()
    time.sleep(0.8)
    assert not done  # rank 1 has not kept its state yet
    second.wait_all_kept()  # both marks there: returns at once
    waiting.join(5)
    assert done and 0.8 <= done[0] - begun < 2.0, done
    monkeypatch.setattr(control, "COLLECT_S", 0.5)
    alone = watcher(0)
    alone.answered = {0, 1, 3}  # rank 3 answered and never marks: the wait is bounded
    begun = time.monotonic()
    alone.wait_all_kept()
    assert 0.4 < time.monotonic() - begun < 2.0


def test_a_rank_waits_for_rank_0_s_store_by_polling_and_gives_up_at_its_bound():
    """runtime/rendezvous.await_store: torch's store client retries a refused connect after 0.25-0.75 s and longer;
    a rank that starts first polls instead (real sockets). It returns once something listens, having connected, and
    returns (no error: init_process_group and the control thread decide then) when nothing listens by its bound."""
    import socket
    import threading

    from clusterddp.runtime.rendezvous import await_store, free_port

    port = free_port()
    accepted = []

    def listen_later() -> None:
        time.sleep(0.3)
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            server.settimeout(30)
            conn, _ = server.accept()
            accepted.append(conn)
            conn.close()

    thread = threading.Thread(target=listen_later)
    thread.start()
    await_store("127.0.0.1", port, 30)
    thread.join(timeout=30)
    assert len(accepted) == 1  # (it returned only after the listener accepted its probe)
    start = time.monotonic()
    await_store("127.0.0.1", free_port(), 0.3)  # nothing listens there: back after its bound
    assert time.monotonic() - start >= 0.3
