"""Report a PyTorch renderer's CUDA caching allocator to the sidecar (``POST /api/gpu/report``).

Call ``post_report(base_url, allocator_report("tts-avatar", stream="live"), token)`` every few
seconds from the renderer. ``torch`` is imported on first use, so this module loads anywhere.
"""

from __future__ import annotations

import importlib
import json
import urllib.request
from typing import Any


def allocator_report(renderer: str, *, stream: str | None = None, device: int | None = None,
                     torch: Any = None) -> dict[str, Any]:
    """The report body for one CUDA device (the current one by default)."""
    torch = torch if torch is not None else importlib.import_module("torch")
    index = torch.cuda.current_device() if device is None else device
    stats = torch.cuda.memory_stats(index)
    # Free blocks the allocator holds: "inactive" blocks of its reserved segments.
    free = [b["size"] for seg in torch.cuda.memory_snapshot() if seg["device"] == index
            for b in seg["blocks"] if b["state"] == "inactive"]
    reserved = stats.get("reserved_bytes.all.current", 0)
    allocated = stats.get("allocated_bytes.all.current", 0)
    return {
        "renderer": renderer, "stream": stream, "device": index,
        "reserved_bytes": reserved, "allocated_bytes": allocated,
        # The two reads are not atomic: a block freed in between must not exceed the reserve.
        "largest_free_block_bytes": min(max(free, default=0), max(reserved - allocated, 0)),
        "inactive_split_bytes": stats.get("inactive_split_bytes.all.current", 0),
        "alloc_retries": stats.get("num_alloc_retries", 0),
        "ooms": stats.get("num_ooms", 0),
    }


def post_report(base_url: str, report: dict[str, Any], token: str | None = None,
                timeout_s: float = 2.0) -> dict[str, Any]:
    """POST one report; returns the service's answer (fragmentation and its correlation)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{base_url.rstrip('/')}/api/gpu/report",
                                     data=json.dumps(report).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer
