"""The in-job half of ``clusterddp doctor`` (``python -m clusterddp.runtime.doctor``, one task per rank).

Every rank initialises the process group, reports its host and the network interface it uses, and times
all-reduces of a few sizes; rank 0 prints one ``DOCTOR {json}`` line that the CLI (clusterddp/doctor.py) turns
into a report and a verdict.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import statistics
import struct
import time
from typing import Any, Dict, List, Optional, Tuple

SIZES = (1 << 10, 1 << 20, 16 << 20)  # bytes per all-reduce
SIOCGIFADDR = 0x8915


def interface_of(ip: str) -> Optional[str]:
    """The network interface that has address ``ip`` (Linux), or None."""
    try:
        names = [name for _, name in socket.if_nameindex()]  # this network namespace's (not /sys's) interfaces
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    return None


def route_to(host: str) -> Tuple[str, Optional[str]]:
    """(local address, interface) this machine uses to reach ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))  # UDP connect: picks a route, sends nothing
        ip = s.getsockname()[0]
    return ip, interface_of(ip)


def _time_allreduce(nbytes: int, device: Any, world: int) -> Dict[str, float]:
    import torch
    import torch.distributed as dist

    t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    iters = 20 if nbytes <= 1 << 20 else 5
    for _ in range(3):
        dist.all_reduce(t)
    times: List[float] = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    # bus bandwidth as nccl-tests defines it: what each link carries in a ring all-reduce
    bus = 2 * (world - 1) / world * nbytes / median if world > 1 else nbytes / median
    return {"bytes": nbytes, "latency_s": median, "busbw_gbs": bus / 1e9}


def main() -> None:
    """Join the group, gather every rank's host and route, time the all-reduces; rank 0 prints the report."""
    import torch
    import torch.distributed as dist

    from .collect import gather_json
    from .group import device, init, shutdown

    env = init(timeout=120)
    dev = device()
    ip, iface = route_to(env.master_addr)
    try:
        host_ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        host_ip = "?"
    me = {"rank": env.rank, "host": socket.gethostname(), "local_rank": env.local_rank, "route_ip": ip,
          "interface": iface, "hostname_ip": host_ip, "device": str(dev),
          "socket_ifname": os.environ.get("NCCL_SOCKET_IFNAME" if dev.type == "cuda" else "GLOO_SOCKET_IFNAME")}
    ranks = gather_json(me)
    check = torch.ones(1, device=dev)
    dist.all_reduce(check)
    timings = [_time_allreduce(n, dev, env.world_size) for n in SIZES]
    if env.rank == 0:
        report = {"world_size": env.world_size, "nodes": env.num_nodes, "backend": dist.get_backend(),
                  "sum_ok": check.item() == env.world_size, "ranks": ranks, "allreduce": timings}
        print("DOCTOR " + json.dumps(report), flush=True)
    shutdown()


if __name__ == "__main__":
    main()
