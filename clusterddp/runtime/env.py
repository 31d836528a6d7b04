"""Where this process sits in the job, read from the launcher's variables: a pure value, no side effects.

``DistEnv.from_env(mapping)`` understands torchrun (RANK, WORLD_SIZE, ...), srun task variables (SLURM_PROCID with
SLURM_STEP_ID) and clusterddp's spawn launcher (CLUSTERDDP_LAUNCHER=spawn with LOCAL_RANK).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional

from .. import contract
from ..errors import RuntimeEnvError
from ..hostlist import HostlistError
from ..hostlist import first as first_host


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job. ``source`` names the launcher the values came from."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: str = "single"

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, allow_single: bool = False) -> "DistEnv":
        """Read the rank layout from torchrun, the spawn launcher or srun (task variables).

        Raises RuntimeEnvError naming the variables seen when they are missing or contradict each other. A
        one-process run (rank 0 of 1) only with ``allow_single=True``, never as a silent fallback.
        """
        env = dict(os.environ if environ is None else environ)
        # The spawn launcher runs inside an srun step too (one task per node): its explicit marker goes first.
        for reader in (_from_torchrun, _from_spawn, _from_srun):
            found = reader(env)
            if found is not None:
                _check_rendered_world(found, env)
                return found
        if "SLURM_PROCID" in env and "SLURM_STEP_ID" not in env and not allow_single:
            raise RuntimeEnvError(
                f"running in the batch script of Slurm job {env.get('SLURM_JOB_ID', '?')} without srun: "
                f"SLURM_NTASKS={env.get('SLURM_NTASKS', '?')} ranks were requested but only this process runs; "
                "launch through srun or torchrun (clusterddp submit does), or pass allow_single=True")
        if allow_single:
            return cls(0, 0, 1, 1, 0, 1, env.get("MASTER_ADDR", "127.0.0.1"),
                       _int(env, "MASTER_PORT") if "MASTER_PORT" in env else 0, "single")
        raise RuntimeEnvError(
            "no distributed environment found: none of RANK/WORLD_SIZE (torchrun), SLURM_PROCID with "
            "SLURM_STEP_ID (srun) or CLUSTERDDP_LAUNCHER=spawn with LOCAL_RANK is set; start this script with "
            "clusterddp submit (or --local), torchrun or srun, or pass allow_single=True for one process")


def _int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    try:
        return int(str(value))
    except ValueError:
        raise RuntimeEnvError(f"{name}={value!r} is not an integer") from None


def _seen(env: Mapping[str, str], names: List[str]) -> str:
    return ", ".join(f"{n}={env[n]}" for n in names if n in env)


def _from_torchrun(env: Mapping[str, str]) -> Optional[DistEnv]:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
             "MASTER_PORT"]
    missing = [n for n in ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if n not in env]
    if missing:
        raise RuntimeEnvError(f"RANK and WORLD_SIZE are set but {', '.join(missing)} not ({_seen(env, names)}): "
                              "a launcher set only part of the torch.distributed variables")
    rank, world, local = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
    local_world = _int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world
    if not (0 <= rank < world and 0 <= local < local_world <= world):
        raise RuntimeEnvError(f"inconsistent ranks ({_seen(env, names)}): need 0 <= RANK < WORLD_SIZE and "
                              "0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE")
    if world % local_world:
        raise RuntimeEnvError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world} "
                              f"({_seen(env, names)}): nodes run different numbers of ranks")
    node = _int(env, "GROUP_RANK") if "GROUP_RANK" in env else (
        _int(env, "NODE_RANK") if "NODE_RANK" in env else rank // local_world)
    source = "torchrun" if "TORCHELASTIC_RUN_ID" in env else env.get(contract.LAUNCHER, "env")
    return DistEnv(rank, local, world, local_world, node, world // local_world, env["MASTER_ADDR"],
                   _int(env, "MASTER_PORT"), source)


def _tasks_per_node(text: str) -> List[int]:
    """Slurm's compact tasks-per-node form: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: List[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise RuntimeEnvError(f"cannot read SLURM tasks per node {text!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _from_srun(env: Mapping[str, str]) -> Optional[DistEnv]:
    # SLURM_PROCID is also set in the batch shell; only a job step (srun) has SLURM_STEP_ID.
    if "SLURM_PROCID" not in env or "SLURM_STEP_ID" not in env:
        return None
    names = ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",
             "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST",
             "SLURM_JOB_NODELIST", "SLURM_JOB_ID"]
    need = ["SLURM_LOCALID", "SLURM_NODEID"]
    missing = [n for n in need if n not in env]
    if missing:
        raise RuntimeEnvError(f"srun task variables incomplete, missing {', '.join(missing)} ({_seen(env, names)})")
    ntasks_name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    nnodes_name = "SLURM_STEP_NUM_NODES" if "SLURM_STEP_NUM_NODES" in env else "SLURM_JOB_NUM_NODES"
    if ntasks_name not in env or nnodes_name not in env:
        raise RuntimeEnvError(f"srun task variables incomplete: need SLURM_NTASKS and SLURM_JOB_NUM_NODES "
                              f"({_seen(env, names)})")
    rank, local, node = _int(env, "SLURM_PROCID"), _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID")
    world, nodes = _int(env, ntasks_name), _int(env, nnodes_name)
    if world % nodes:
        raise RuntimeEnvError(f"{ntasks_name}={world} is not a multiple of {nnodes_name}={nodes} "
                              f"({_seen(env, names)}): likely --ntasks-per-node does not match the GPUs per node")
    per_node_name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    local_world = world // nodes
    if per_node_name in env:
        counts = _tasks_per_node(env[per_node_name])
        if len(set(counts)) > 1:
            raise RuntimeEnvError(f"{per_node_name}={env[per_node_name]}: nodes run different numbers of tasks; "
                                  "DDP needs the same number per node (use --ntasks-per-node)")
    if not (0 <= rank < world and 0 <= local < local_world and 0 <= node < nodes):
        raise RuntimeEnvError(f"inconsistent srun variables ({_seen(env, names)})")
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
    else:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise RuntimeEnvError(f"no MASTER_ADDR and no SLURM_JOB_NODELIST to take it from ({_seen(env, names)})")
        try:
            addr = first_host(nodelist)  # never `scontrol` through a shell (CVE-2024-27763)
        except HostlistError as exc:
            raise RuntimeEnvError(f"cannot take MASTER_ADDR from the node list: {exc}") from None
    if "MASTER_PORT" in env:
        port = _int(env, "MASTER_PORT")
    elif "SLURM_JOB_ID" in env:
        port = contract.default_port(_int(env, "SLURM_JOB_ID"))
    else:
        raise RuntimeEnvError(f"no MASTER_PORT and no SLURM_JOB_ID to derive it from ({_seen(env, names)})")
    return DistEnv(rank, local, world, local_world, node, nodes, addr, port, "srun")


def _from_spawn(env: Mapping[str, str]) -> Optional[DistEnv]:
    if env.get(contract.LAUNCHER) != "spawn" or "LOCAL_RANK" not in env:
        return None
    names = ["LOCAL_RANK", "NODE_RANK", contract.NNODES, contract.PROCS_PER_NODE, "MASTER_ADDR", "MASTER_PORT"]
    missing = [n for n in names if n not in env]
    if missing:
        raise RuntimeEnvError(f"spawn launcher variables incomplete, missing {', '.join(missing)} "
                              f"({_seen(env, names)})")
    local, node = _int(env, "LOCAL_RANK"), _int(env, "NODE_RANK")
    per_node, nodes = _int(env, contract.PROCS_PER_NODE), _int(env, contract.NNODES)
    if not (0 <= local < per_node and 0 <= node < nodes):
        raise RuntimeEnvError(f"inconsistent spawn variables ({_seen(env, names)})")
    return DistEnv(node * per_node + local, local, nodes * per_node, per_node, node, nodes, env["MASTER_ADDR"],
                   _int(env, "MASTER_PORT"), "spawn")


def _check_rendered_world(found: DistEnv, env: Mapping[str, str]) -> None:
    """The world size the job was rendered for (CLUSTERDDP_WORLD_SIZE) must match what the launcher started."""
    if contract.WORLD_SIZE in env and _int(env, contract.WORLD_SIZE) != found.world_size:
        raise RuntimeEnvError(
            f"the job was rendered for {contract.WORLD_SIZE}={env[contract.WORLD_SIZE]} ranks "
            f"(nodes x GPUs per node) but the {found.source} launcher started {found.world_size} "
            f"({found.num_nodes} node(s) x {found.local_world_size}): likely ntasks-per-node does not match GPUs")
