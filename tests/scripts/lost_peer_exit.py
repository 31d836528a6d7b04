"""A rank whose peer is lost (issue 55's fast exit, tests/test_peer_heal.py): every rank opens files it writes
without closing them, registers an exit handler and keeps an object whose deletion leaves a mark; the last rank
SIGKILLs itself after a barrier, the others meet it gone in an all-reduce. argv: OUT_DIR [plain|raise] (plain: no
process group, a normal end; raise: a ValueError of the script's own after init())."""
import atexit
import gzip
import os
import signal
import sys

import torch
import torch.distributed as dist

from clusterddp import runtime

out = sys.argv[1]
rank = int(os.environ["RANK"])
text = open(os.path.join(out, f"text-{rank}.log"), "w")  # noqa: SIM115 (left open on purpose)
packed = gzip.open(os.path.join(out, f"packed-{rank}.gz"), "wt")  # noqa: SIM115
for i in range(100):
    text.write(f"line {i} of rank {rank}\n")
    packed.write(f"line {i} of rank {rank}\n")
atexit.register(lambda: open(os.path.join(out, f"atexit-{rank}"), "w").close())


class Teardown:
    def __del__(self, mark=os.path.join(out, f"teardown-{rank}"), make=open):  # (builtins go in the teardown)
        make(mark, "w").close()  # runs at the interpreter's teardown, which a rank ended by a lost peer skips


kept = Teardown()
if sys.argv[2:] == ["plain"]:
    sys.exit(0)
runtime.init()
if sys.argv[2:] == ["raise"]:
    raise ValueError("the script's own mistake")
dist.barrier()
if rank == runtime.world_size() - 1:
    os.kill(os.getpid(), signal.SIGKILL)
while True:
    dist.all_reduce(torch.ones(1))
