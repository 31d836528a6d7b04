"""What this process's GPU says, for the step telemetry: utilisation (where NVML answers) and memory."""
from __future__ import annotations

from typing import Any, Dict, Optional


def state() -> Optional[Dict[str, Any]]:
    """This process's GPU: utilisation (where NVML answers) and memory, peak and total (None without CUDA in use;
    read by the control thread: no synchronisation, no collective)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    try:
        index = torch.cuda.current_device()
        util: Optional[int] = None
        try:
            util = int(torch.cuda.utilization(index))
        except Exception:  # no pynvml / NVML
            pass
        return {"util": util, "mem_mb": int(torch.cuda.max_memory_allocated(index) >> 20),
                "total_mb": int(torch.cuda.get_device_properties(index).total_memory >> 20)}
    except Exception:
        return None
