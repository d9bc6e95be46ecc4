"""Host -> device copies that do not make the host wait.

A blocking copy from pageable host memory waits for the GPU's stream; a non-blocking one from
pinned (page-locked) memory is queued behind the work already there and the host goes on. The
engine gathers what a step sends into one array and sends it with :func:`to_device`.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["to_device"]


def to_device(array: np.ndarray, device) -> torch.Tensor:
    """``array`` (any numpy dtype torch has, any shape) as a tensor on ``device``, copied without
    a host sync: through pinned memory and a non-blocking copy on a CUDA device (other devices: a
    plain copy); on the CPU the tensor shares ``array``'s memory (the caller does not change
    ``array`` afterwards)."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    kind = torch.device(device).type
    if kind == "cpu":
        return host
    if kind == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)
