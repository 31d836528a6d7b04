"""The checks of the GPU desk check (issue 28, ../shared/gpu-desk-check.md) that only CUDA and NCCL can answer, run by
``make gpu-check`` (bench/gpu_check.py) on the GPUs the environment gives it (CUDA_VISIBLE_DEVICES honoured).

- per-rank (one NCCL job of all visible GPUs, one rank per GPU): wrap() of a sparse-gradient model (5), wrap with
  device_ids=None on every rank (6), the CUDA random state saved from and restored to each rank's own device, also
  when the resumed run sees one GPU per rank (4), native bf16 and the compute capability (P4), distinct GPUs per
  rank (P11);
- the watchdog before torch's timeout: a rank that never reaches wrap() (NCCL's lazy communicator set-up) ends the
  job with the roll call and exit 79, not torch's abort (1); the dump directory of a --local run exists (3);
- a job that asked for no GPUs stays off them without a mask: CPU, gloo, CUDA never initialised (10).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
Row = Tuple[str, str, str]

PER_RANK = r'''
import json, os, sys, torch
from clusterddp import runtime
phase, ckpt_dir = sys.argv[1], sys.argv[2]
env = runtime.init(timeout=120)
dev = runtime.device()
out = {"rank": env.rank, "device": str(dev), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
ck = runtime.Checkpointer(ckpt_dir)
if phase == "save":
    props = torch.cuda.get_device_properties(dev)
    out.update(uuid=str(getattr(props, "uuid", props.name)),
               capability=".".join(map(str, torch.cuda.get_device_capability(dev))),
               bf16_native=torch.cuda.is_bf16_supported(including_emulation=False))
    try:
        model = torch.nn.Sequential(torch.nn.Embedding(100, 8, sparse=True), torch.nn.Flatten(),
                                    torch.nn.Linear(16, 1))
        wrapped = runtime.wrap(model)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
        wrapped(torch.randint(0, 100, (4, 2), device=dev)).sum().backward()
        opt.step()
        out["sparse"] = "ok"
    except Exception as exc:
        out["sparse"] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        plain = runtime.wrap(torch.nn.Linear(8, 1), device_ids=None)
        plain(torch.randn(4, 8, device=dev)).sum().backward()
        out["device_ids_none"] = "ok"
    except Exception as exc:
        out["device_ids_none"] = f"{type(exc).__name__}: {exc}"[:200]
    torch.cuda.manual_seed(1000 + env.rank)
    torch.rand(3, device=dev)
    ck.save(1, torch.nn.Linear(2, 2))
    out["cuda_state"] = torch.cuda.get_rng_state(dev).sum().item()
else:
    torch.cuda.manual_seed(7)
    ck.load_latest(torch.nn.Linear(2, 2))
    out["cuda_state"] = torch.cuda.get_rng_state(dev).sum().item()
runtime.barrier()
print("RESULT " + json.dumps(out), flush=True)
runtime.shutdown()
'''

NEVER_WRAPS = r'''
import os, time, torch
from clusterddp import runtime
env = runtime.init()
if env.rank == env.world_size - 1:
    time.sleep(3600)  # never reaches wrap(): the others wait in NCCL's communicator set-up
model = runtime.wrap(torch.nn.Linear(8, 8))
print("not reached", flush=True)
'''

GPUS_ZERO = r'''
import json, torch
from clusterddp import runtime
runtime.init(allow_single=True)
print("RESULT " + json.dumps({"device": str(runtime.device()), "cuda_initialised": torch.cuda.is_initialized()}))
runtime.shutdown()
'''


def visible(n: int) -> List[str]:
    """The GPUs this environment gives us, as CUDA_VISIBLE_DEVICES names them (never others: desk check 9)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in given.split(",") if d.strip()] if given else [str(i) for i in range(n)]
    return ids[:n]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(script: Path, args: Sequence[str], masks: Sequence[str], work: Path, timeout: float = 300) -> List[dict]:
    """One process per mask (CUDA_VISIBLE_DEVICES of that rank), srun-style variables; their RESULT lines."""
    n, port, procs = len(masks), free_port(), []
    for r, mask in enumerate(masks):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES=mask,
                   CLUSTERDDP_GPUS_PER_NODE=str(n))
        procs.append(subprocess.Popen([PY, str(script), *args], env=env, cwd=work, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    found = [json.loads(line.split("RESULT ", 1)[1]) for o in outs for line in o.splitlines() if "RESULT " in line]
    if len(found) != n:
        raise RuntimeError(" | ".join(o[-300:] for o in outs))
    return sorted(found, key=lambda r: r["rank"])


def check_per_rank(rows: List[Row], n: int, work: Path) -> None:
    script, ckpt = work / "desk_rank.py", work / "desk-ckpt"
    script.write_text(PER_RANK)
    ids = visible(n)
    saved = ranks(script, ["save", str(ckpt)], [",".join(ids)] * n, work)  # gpus-per-node: every rank sees all
    resumed = ranks(script, ["load", str(ckpt)], ids, work)                 # gpus-per-task: one each
    # NCCL cannot all-reduce sparse tensors (torch 2.11, H100): wrap() refuses such a model, saying what to do.
    refused = [r for r in saved if r["sparse"].startswith("RuntimeEnvError: runtime.wrap()")]
    bad = [r for r in saved if r["sparse"] != "ok" and r not in refused]
    rows.append(("wrap() of a model with sparse gradients (nn.Embedding(sparse=True)), NCCL",
                 f"{n - len(bad) - len(refused)} of {n} ranks trained, {len(refused)} refused in wrap()"
                 + (f"; {(bad or refused)[0]['sparse']}" if bad or refused else ""), "FAILED" if bad else "ok"))
    bad = [r for r in saved if r["device_ids_none"] != "ok"]
    rows.append(("wrap(model, device_ids=None) on every rank", f"{n - len(bad)} of {n} ranks ok"
                 + (f"; {bad[0]['device_ids_none']}" if bad else ""), "FAILED" if bad else "ok"))
    same = [a["cuda_state"] == b["cuda_state"] for a, b in zip(saved, resumed)]
    rows.append(("CUDA random state per rank: saved with all GPUs visible, restored with one visible per rank",
                 f"{sum(same)} of {n} ranks restored their own device's state", "ok" if all(same) else "FAILED"))
    uuids = {r["uuid"] for r in saved}
    rows.append(("one distinct GPU per rank (P11)", f"{len(uuids)} distinct of {n}",
                 "ok" if len(uuids) == n else "FAILED"))
    caps = sorted({(r["capability"], r["bf16_native"]) for r in saved})
    rows.append(("compute capability, native bf16 (P4: is_bf16_supported() counts emulation)",
                 ", ".join(f"sm {c}: bf16 {'native' if b else 'emulated only'}" for c, b in caps), "info"))


def check_watchdog_first(rows: List[Row], n: int, work: Path) -> None:
    if n < 2:
        rows.append(("watchdog before torch's timeout at NCCL set-up", "needs 2 GPUs", "skipped"))
        return
    script = work / "never_wraps.py"
    script.write_text(NEVER_WRAPS)
    out = work / "wd-runs"
    start = time.monotonic()
    proc = subprocess.run([PY, "-m", "clusterddp", "submit", "--local", "--nodes", "1", "--gpus", str(n),
                           "--launcher", "srun", "--hang-timeout", "0:15", "--output-dir", str(out), str(script)],
                          cwd=work, capture_output=True, text=True, timeout=600)
    took = time.monotonic() - start
    runs = list(out.glob("never_wraps-local-*"))
    rollcall = bool(runs) and any(runs[0].glob("stacks/hang-*/rollcall.txt"))
    trace_dir = bool(runs) and (runs[0] / "nccl-trace").is_dir()
    ok = proc.returncode == 79 and rollcall
    rows.append((f"a rank that never reaches wrap() ({n} ranks, --hang-timeout 0:15: start-up window 30 s, torch's "
                 "timeout 150 s)", f"exit {proc.returncode} after {took:.0f} s, roll call "
                 f"{'written' if rollcall else 'missing'}", "ok" if ok else "FAILED: " + proc.stderr[-300:]))
    dumps = len(list(runs[0].glob("nccl-trace/rank_*"))) if runs else 0
    rows.append(("--local NCCL run: RUN_DIR/nccl-trace/ exists for torch's dumps", f"directory "
                 f"{'there' if trace_dir else 'missing'}, {dumps} dump file(s)", "ok" if trace_dir else "FAILED"))


def check_gpus_zero(rows: List[Row], n: int, work: Path) -> None:
    script = work / "gpus_zero.py"
    script.write_text(GPUS_ZERO)
    env = dict(os.environ, CLUSTERDDP_GPUS_PER_NODE="0", CUDA_VISIBLE_DEVICES=",".join(visible(n)))
    proc = subprocess.run([PY, str(script)], env=env, cwd=work, capture_output=True, text=True, timeout=120)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    got = json.loads(line[7:]) if line else {}
    ok = got == {"device": "cpu", "cuda_initialised": False}
    rows.append(("--gpus 0 job on an unmasked GPU node: CPU and gloo, CUDA untouched",
                 json.dumps(got) if got else proc.stderr[-200:], "ok" if ok else "FAILED"))


CHECKS: Tuple[Callable[[List[Row], int, Path], None], ...] = (check_per_rank, check_watchdog_first, check_gpus_zero)
