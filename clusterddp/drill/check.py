"""The drill's look inside two checkpoints: the first part that differs (login side; torch only to read them, with
weights_only)."""
from __future__ import annotations

from typing import Any, Optional

GENERATORS = {"python": "Python's random", "torch": "torch's CPU generator", "numpy": "numpy's global generator",
              "cuda": "the CUDA generator"}


def differs(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                    and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() != b.keys() or any(differs(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) != len(b) or any(differs(x, y) for x, y in zip(a, b))
    return bool(a != b)


def component(path_a: str, path_b: str, generators: bool = False) -> Optional[str]:
    """The first part of two checkpoints that differs: the model, the optimizer, the loader position, an extra
    entry; with ``generators``, the random generators first (a generator the script never uses differs between
    any two processes that did not seed it, so it only explains a difference found elsewhere)."""
    import torch

    a, b = (torch.load(p, map_location="cpu", weights_only=True) for p in (path_a, path_b))
    if generators:
        found = sorted({key for ra, rb in zip(a.get("rng") or [], b.get("rng") or []) for key in set(ra) | set(rb)
                        if differs(ra.get(key), rb.get(key))}, key=lambda k: list(GENERATORS).index(k)
                       if k in GENERATORS else len(GENERATORS))
        if found:
            return " and ".join(GENERATORS.get(k, k) for k in found)
    for key, name in (("model", "model"), ("optimizer", "optimizer"), ("loader", "loader position")):
        if differs(a.get(key), b.get(key)):
            return name
    for key in sorted(set(a.get("extra") or {}) | set(b.get("extra") or {})):
        if differs((a.get("extra") or {}).get(key), (b.get("extra") or {}).get(key)):
            return f"extra entry {key!r}"
    if differs(a.get("per_rank"), b.get("per_rank")):
        return "per-rank entries"
    return None
