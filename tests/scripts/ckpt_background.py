"""Background checkpoints whose write fails (the checkpoint directory replaced by a file, as a full or vanished file
system would fail them): every rank must learn it, at should_stop() and at shutdown(). Prints one line per rank:
"RAISED <where> <message>"."""
import argparse
import os
import shutil
import time

import torch
import torch.nn as nn

from clusterddp import runtime
from clusterddp.errors import RuntimeEnvError


def break_directory(directory: str) -> None:
    runtime.barrier()  # every rank is done looking at the directory
    if runtime.is_main():
        shutil.rmtree(directory)
        with open(directory, "w") as fh:
            fh.write("not a directory\n")
    runtime.barrier()


def mend_directory(directory: str) -> None:
    if runtime.is_main():
        os.unlink(directory)
        os.makedirs(directory)
    runtime.barrier()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--no-shutdown", action="store_true", help="return after the last failed write, no shutdown()")
    args = p.parse_args()
    runtime.init(timeout=60, allow_single=True)
    model = nn.Linear(4, 2)  # (no DDP: what travels is a write's error, over the control channel)
    ckpt = runtime.Checkpointer(args.dir, background=True)
    ckpt.save(1, model)
    ckpt.wait()
    assert os.path.exists(os.path.join(args.dir, "ckpt-0000000001.pt"))
    break_directory(args.dir)
    ckpt.save(2, model)                      # returns at once: the write fails on rank 0's thread
    for _ in range(400):
        try:
            if runtime.should_stop():
                raise SystemExit("should_stop() said stop: nobody asked")
        except RuntimeEnvError as exc:
            print(f"RAISED should_stop {exc}", flush=True)
            break
        time.sleep(0.05)
    else:
        raise SystemExit(f"rank {runtime.rank()}: should_stop() never reported the failed write")
    mend_directory(args.dir)
    ckpt.save(3, model)
    ckpt.wait()
    break_directory(args.dir)
    ckpt.save(4, model)
    with torch.no_grad():
        model.module.weight.add_(1.0) if hasattr(model, "module") else model.weight.add_(1.0)
    if args.no_shutdown:
        print("RETURNED without shutdown", flush=True)
        return
    try:
        runtime.shutdown()
    except RuntimeEnvError as exc:
        print(f"RAISED shutdown {exc}", flush=True)
    else:
        raise SystemExit(f"rank {runtime.rank()}: shutdown() never reported the failed write")


if __name__ == "__main__":
    main()
