"""``clusterddp explain``: what a job will look like, without submitting it (a pure function of the spec)."""
from __future__ import annotations

import re
from typing import List

from ..contract import HANG_EXIT
from .spec import JobSpec

SHOWN_NODES = 4  # nodes listed in full before the table is abbreviated


def layout(spec: JobSpec) -> List[str]:
    """The node -> ranks -> local ranks -> GPUs table."""
    per = spec.tasks_per_node
    lines = [f"{'node':<8}{'ranks':<16}{'local ranks':<16}{'GPUs (CUDA_VISIBLE_DEVICES)'}"]
    # Never linear in the node count: the first few nodes, then the last.
    nodes = list(range(min(spec.nodes, SHOWN_NODES + 1)))
    if spec.nodes > SHOWN_NODES + 1:
        nodes = nodes[:SHOWN_NODES] + [-1, spec.nodes - 1]
    for n in nodes:
        if n < 0:
            lines.append(f"{'...':<8}")
            continue
        first = n * per
        ranks = f"{first}" if per == 1 else f"{first}-{first + per - 1}"
        local = "0" if per == 1 else f"0-{per - 1}"
        if not spec.gpus_per_node:
            gpus = "none (CPU, gloo)"
        elif spec.gpu_request == "gpus-per-task":
            gpus = "one per task, each sees it as device 0"
        else:
            gpus = f"0-{spec.gpus_per_node - 1}, rank uses LOCAL_RANK" if spec.gpus_per_node > 1 else "0"
        lines.append(f"{n:<8}{ranks:<16}{local:<16}{gpus}")
    return lines


def environment(spec: JobSpec) -> List[str]:
    """Every variable the training script sees, with where it comes from."""
    per, rows = spec.tasks_per_node, []
    if spec.launcher == "torchrun":
        rows += [("RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK", "torchrun, per worker (GROUP_RANK: the "
                  "node's SLURM_NODEID, given at its static rendezvous; RANK = GROUP_RANK x ranks per node + "
                  "LOCAL_RANK)"),
                 ("MASTER_ADDR, MASTER_PORT", "torchrun (its rendezvous store in the first node's agent)"),
                 ("TORCHELASTIC_RUN_ID", "torchrun (= the Slurm job id, --rdzv-id)")]
    elif spec.launcher == "srun":
        rows += [("RANK, LOCAL_RANK, WORLD_SIZE, NODE_RANK", "set inside each srun task from SLURM_PROCID, "
                  "SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID"),
                 ("LOCAL_WORLD_SIZE", f"the srun template ({per})"),
                 ("MASTER_ADDR, MASTER_PORT", "the batch shell (below), inherited through srun")]
    else:
        rows += [("NODE_RANK", "the spawn template, from SLURM_NODEID"),
                 ("MASTER_ADDR, MASTER_PORT", "the batch shell (below); also as {master_addr}/{master_port}"),
                 ("(ranks)", f"your script's own mp.spawn workers: rank = node rank x {per} + local index")]
    rows += [("CLUSTERDDP_WORLD_SIZE, CLUSTERDDP_NNODES, CLUSTERDDP_PROCS_PER_NODE, CLUSTERDDP_LAUNCHER",
              "the batch script (clusterddp.runtime checks the launcher against them)"),
             ("CLUSTERDDP_RUN_DIR", "the batch script: <output dir>/<name>-<job id>"),
             ("OMP_NUM_THREADS", f"the batch script: {spec.cpus_per_task or 1} (CPUs per rank)"),
             ("PYTHONUNBUFFERED", "the batch script: 1 (logs appear as they are written)")]
    if spec.gpus_per_node:
        rows.append(("CUDA_VISIBLE_DEVICES", "Slurm, from the GPU request"))
    if spec.requeues:
        rows.append(("CLUSTERDDP_STOP_FILE", "the batch script: appears when the job must checkpoint and stop"))
    rows += [("SLURM_*", "Slurm (job and step variables)")]
    rows += [(name, "--env") for name, _ in spec.env]
    out = []
    for name, source in rows:  # long groups of names get a line of their own
        out += [f"{name:<26}  {source}"] if len(name) <= 26 else [name, f"{'':<26}  {source}"]
    return out


def warnings(spec: JobSpec) -> List[str]:
    """Known mistakes, caught before the queue."""
    out = []
    if spec.gpus_per_node and (spec.cpus_per_task or 1) == 1:
        out.append("1 CPU per rank: DataLoader workers, data decoding and NCCL threads share one core; give "
                   "-c/--cpus-per-task (CPUs per rank), e.g. -c 8")
    batch = _batch_size(spec.args)
    if batch is not None and spec.world_size > 1:
        out.append(f"--batch-size {batch} is per rank in DDP: the global batch is {batch} x {spec.world_size} = "
                   f"{batch * spec.world_size}; scale the learning rate or the per-rank batch accordingly")
    if spec.world_size == 1:
        out.append("world size 1: DDP adds synchronisation for nothing; fine for a test run")
    if spec.gpus_per_node > 8:
        out.append(f"{spec.gpus_per_node} GPUs per node is more than most nodes have (8): check the partition")
    if spec.time is None:
        out.append("no --time: the partition's default limit applies, and requeue-on-time-limit is off")
    elif spec.requeues:
        out.append(f"requeue on: {spec.signal_seconds} s before the limit your script must checkpoint and stop "
                   "(clusterddp.runtime.should_stop() and Checkpointer), or the work since the last checkpoint is lost")
    if spec.launcher == "spawn" and not any("{" in a for a in spec.args):
        out.append("spawn launcher without placeholders: your script must find the rendezvous itself; pass e.g. "
                   "--dist-url 'tcp://{master_addr}:{master_port}' --rank {node_rank} --world-size {nnodes}")
    if spec.launcher != "spawn" and any("{master_" in a or "{node_rank}" in a for a in spec.args):
        out.append(f"placeholders such as {{master_addr}} are filled in only by the spawn launcher; the "
                   f"{spec.launcher} launcher passes them on literally")
    return out


def _batch_size(args: tuple) -> "int | None":
    for i, a in enumerate(args):
        m = re.fullmatch(r"--(?:batch[-_]size|bs)(?:=(.*))?", a)
        if m:
            value = m.group(1) if m.group(1) is not None else (args[i + 1] if i + 1 < len(args) else "")
            return int(value) if re.fullmatch(r"[0-9]{1,9}", str(value)) else None
    return None


def peer_heal(spec: JobSpec) -> str:
    """Where a retry after a lost node starts (runtime/peerheal.py decides in the job; docs/node-failure.md)."""
    if not spec.peer_heal:
        return "  a retry starts from the last checkpoint (--no-peer-heal)"
    if spec.nodes < 2:
        return "  a retry starts from the last checkpoint (peer heal needs 2 or more nodes: the survivors' memory)"
    if spec.gpus_per_node > 0:
        return ("  a retry starts from the last checkpoint where the ranks use NCCL (GPUs: peer heal keeps nothing "
                "there yet, not verified on a GPU; said in the job's log); ranks on gloo, without GPUs, start from "
                "the survivors' memory where the script's Checkpointer kept it (--no-peer-heal: always the "
                "checkpoint)")
    return ("  a retry starts from the survivors' memory (peer heal: at most the step in flight redone, nothing read "
            "from the checkpoint directory) where the script's Checkpointer kept it, else from the last checkpoint, "
            "saying why (--no-peer-heal: always the checkpoint)")


def node_faults(spec: JobSpec) -> List[str]:
    """What the job does after a node fault (templates/base.sh.j2's retry loop)."""
    if not spec.retries:
        return ["retries: off (--retries 0): a node fault ends the job"]
    then = (f"on a spare while one is left ({spec.spare_nodes} spare node(s): Slurm allocates {spec.alloc_nodes}, "
            f"each attempt runs on {spec.nodes})" if spec.spare_nodes else "no spare nodes (--spare-nodes)")
    last = ("then the job requeues itself with the node(s) at fault excluded (within --max-requeues) when its "
            "partition still has room without them, else runs again in place if the health gate passes them"
            + {True: " (an expedited requeue: it starts again at once, not after Slurm's requeue delay)",
               False: " (after Slurm's requeue delay, 120 s by default; --expedite where the cluster allows it)",
               None: " (expedited, starting again at once, where the cluster allows it: scontrol show config "
                     "lists enable_expedited_requeue; else after Slurm's requeue delay)"}[spec.expedite]
            if spec.requeues else "then the job ends (requeue is off: --time or --requeue turns it on)")
    out = [f"retries: up to {spec.retries} after a node fault (Slurm's node failure, ranks silent in a hang's roll "
           "call the others answered, ranks that never arrived), without the node(s) at "
           "fault; after every rank of a node killed with nothing from Slurm (a suspect), without it where a spare "
           "is free, else in place; once in place after an unclear one (one rank killed, a segfault, a hang in the "
           "script's own code); a Python exception, abort(), an out-of-memory kill, an unclear failure again are "
           "the program's: never retried (--retries)",
           f"  {then}; {last}",
           peer_heal(spec),
           ("  every rank is forked from its node's warm server, torch imported once per node (--warm-start): a "
            "retry's ranks start without importing it again"
            + (" (each node's torchrun agent is forked too, in the ranks' python)" if spec.launcher == "torchrun"
               else "")
            if spec.warm_start else
            "  a retry's ranks start as the first attempt's did, importing torch again"
            + (" (--warm-start: forked from a server per node that imported it once)"
               if spec.launcher in ("srun", "torchrun") else "")),
           "health gate: before " + ("every attempt" if spec.health_check or spec.spare_nodes else "each retry")
           + ", each candidate node checks that the run directory is writable there and its GPUs are visible "
           "(nvidia-smi)" + (f", and runs --health-check {spec.health_check!r}" if spec.health_check else "")
           + "; a node that fails gets no rank",
           "a node at fault (not a suspect) is quarantined on this cluster for later submissions (clusterddp nodes)"]
    if spec.exclude:
        out.append(f"left out now: {','.join(spec.exclude)} (--exclude and the quarantine)")
    return out


def explain(spec: JobSpec) -> str:
    per = spec.tasks_per_node
    how = (f"{spec.nodes} node(s) x {spec.gpus_per_node} GPU(s) per node" if spec.gpus_per_node
           else f"{spec.nodes} node(s) x {per} CPU process(es) per node (--procs-per-node)")
    slurm_tasks = spec.slurm_tasks_per_node
    lines = [f"world size = {how} = {spec.world_size} ranks ({spec.launcher} launcher, backend "
             f"{'NCCL on GPUs' if spec.gpus_per_node else 'gloo'})",
             f"Slurm tasks: {slurm_tasks} per node "
             + ("(one per rank)" if slurm_tasks == per else f"(one per node; it starts {per} ranks)")
             + (f", {spec.slurm_cpus_per_task} CPUs each" if spec.slurm_cpus_per_task else ""), "",
             "layout:"]
    lines += ["  " + line for line in layout(spec)]
    port = (f"{spec.master_port} (--master-port; the job fails if it is taken)" if spec.master_port else
            "20000 + job id mod 10000 (job 123456 -> 23456): outside the ephemeral range, different for nearby "
            "job ids; checked free on the first node, else the next free port, which every node then uses")
    lines += ["", "rendezvous:",
              "  MASTER_ADDR  first host of `scontrol show hostnames \"$SLURM_JOB_NODELIST\"`, in the batch shell on "
              "the first node (the job stops if there is none)",
              f"  MASTER_PORT  {port}", "", "hangs:"]
    seconds = spec.hang_timeout_seconds
    lines.append(f"  hang watchdog: on, ends the job when no rank advances for {seconds} s (twice that until each "
                 f"rank's first step ends); the roll call goes into the batch log; exit code {HANG_EXIT} (--hang-"
                 "timeout; scripts using clusterddp.runtime)" if seconds else "  hang watchdog: off (--hang-timeout 0)")
    if spec.gpus_per_node:
        lines.append("  flight recorder: on, each rank's last NCCL collectives go to RUN_DIR/nccl-trace/ on a timeout "
                     "or hang (TORCH_NCCL_TRACE_BUFFER_SIZE=2000; --no-flight-recorder)" if spec.flight_recorder
                     else "  flight recorder: off (--no-flight-recorder)")
    lines.append("  clusterddp stacks JOBID: where every rank is, while the job runs")
    lines += ["", "node faults:"] + ["  " + line for line in node_faults(spec)]
    lines += ["", "environment of the training script:"]
    lines += ["  " + line for line in environment(spec)]
    found = warnings(spec)
    lines += ["", "warnings:" if found else "warnings: none"]
    lines += [f"  - {w}" for w in found]
    return "\n".join(lines) + "\n"
