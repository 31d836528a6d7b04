"""Small values shared between ranks (a checkpoint's path, random states, doctor's host facts) as JSON over the CPU
control channel.

Not torch's object collectives: those pickle (a peer's bytes would be code on load) and need NumPy, which torch's
wheels do not install. JSON carries only data, and the bytes travel as uint8 tensors on the gloo channel, never on
the training device's stream.
"""
from __future__ import annotations

import json
from typing import Any, List

from .state import channel, distributed, rank, world_size


def _tensor(data: bytes, length: int) -> Any:
    import torch

    out = torch.zeros(length, dtype=torch.uint8)
    if data:
        out[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def gather_json(value: Any) -> List[Any]:
    """Every rank's ``value`` (JSON-able), in rank order, on every rank (collective)."""
    if not distributed():
        return [json.loads(json.dumps(value))]
    import torch
    import torch.distributed as dist

    data = json.dumps(value, separators=(",", ":")).encode()
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size())]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=channel())
    longest = max(int(s.item()) for s in sizes)
    buffers = [torch.zeros(longest, dtype=torch.uint8) for _ in sizes]
    dist.all_gather(buffers, _tensor(data, longest), group=channel())
    return [json.loads(bytes(b[:int(s.item())].tolist())) for b, s in zip(buffers, sizes)]


def broadcast_json(value: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``value`` (JSON-able) on every rank (collective; the others' ``value`` is ignored)."""
    if not distributed():
        return json.loads(json.dumps(value))
    import torch
    import torch.distributed as dist

    data = json.dumps(value, separators=(",", ":")).encode() if rank() == src else b""
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(size, src, group=channel())
    buffer = _tensor(data, int(size.item()))
    dist.broadcast(buffer, src, group=channel())
    return json.loads(bytes(buffer.tolist()))
