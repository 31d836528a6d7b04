"""A rank of bench item 18's second part (issue 55's first design, what its floor leaves out): clusterddp's runtime,
4 gloo ranks on one machine, rank 3 SIGKILLed in an all-reduce after 5 steps. Rank 1's ring neighbours (0 and 2)
survive, so it stays blocked in the all-reduce (gloo's abort() does not end a collective in flight in torch 2.13)
until a thread, told of the loss by a survivor's mark, shuts down the process's TCP connections other than the
rendezvous store's. Every survivor then leaves (runtime.shutdown()), joins again as 3 ranks on a new port
(runtime.init()) in the same process, wraps the model in DDP again and trains 5 steps. Each writes its marks to
DIR/rN.log: the loss met, left, joined, trained again (with its parameters' sum, which must agree).

    RANK=r ... PORT2=P python bench/inplace_rejoin.py DIR      # (bench/inplace_floor.py starts the four)
"""
import gc
import os
import signal
import socket
import sys
import threading
import time

import torch
import torch.nn as nn

from clusterddp import runtime
from clusterddp.runtime.peerlink import lost_peer

OUT, RANK = sys.argv[1], int(os.environ["RANK"])


def mark(what: str) -> None:
    with open(os.path.join(OUT, f"r{RANK}.log"), "a") as f:
        f.write(f"{time.time():.6f} {what}\n")


def train(steps: int, kill_at: int = -1) -> float:
    torch.manual_seed(0)
    model = runtime.wrap(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        if step == kill_at and runtime.rank() == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = model(torch.ones(4, 8) * (runtime.rank() + 1)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(sum(p.detach().sum() for p in model.parameters()))


def release_when_told(store_port: int) -> None:
    """Once a survivor has marked the loss: shut down every TCP connection of this process but the store's."""
    while not os.path.exists(os.path.join(OUT, "lost")):
        time.sleep(0.005)
    shut = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(fd))
        except OSError:  # not a socket
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6) \
                    and sock.getpeername()[1] != store_port:
                sock.shutdown(socket.SHUT_RDWR)
                shut += 1
        except OSError:
            pass
        finally:
            sock.detach()
    mark(f"released {shut}")


def main() -> None:
    runtime.init(timeout=60)
    threading.Thread(target=release_when_told, args=(int(os.environ["MASTER_PORT"]),), daemon=True).start()
    try:
        train(10, kill_at=5)
        mark("no loss")
        return
    except Exception as exc:  # noqa: BLE001 (a lost peer is what is measured; anything else is printed)
        if not lost_peer(exc):
            raise
        mark("lost")
        open(os.path.join(OUT, "lost"), "a").close()
        exc.__traceback__ = None  # (its frames hold the model, DDP and the broken group)
    runtime.shutdown()
    gc.collect()
    mark("left")
    os.environ.update(WORLD_SIZE="3", LOCAL_WORLD_SIZE="3", MASTER_PORT=os.environ["PORT2"])
    runtime.init(timeout=60)
    mark("joined")
    total = train(5)
    mark(f"trained {total:.9g}")
    runtime.shutdown()


if __name__ == "__main__":
    main()
