"""Device names checked before any work starts.

Every command and library entry point that takes a device (``"cpu"``,
``"cuda"``, ``"cuda:1"``, ``"mps"``) passes it through :func:`check_device`
first, so a typo or a missing accelerator is reported as one line before a
checkpoint is read, a folder is created or a step is trained.
"""

from __future__ import annotations

from typing import Any

import torch

SUPPORTED = ("cpu", "cuda", "mps")


def check_device(device: Any) -> torch.device:
    """Parse a device name and check that torch can use it here.

    Args:
        device: A name such as ``"cpu"``, ``"cuda"``, ``"cuda:0"`` or ``"mps"``, or a
            ``torch.device``.

    Returns:
        The ``torch.device``.

    Raises:
        ValueError: With a one-line message: the name is not a device, its type is
            not one mechlab runs on (``meta``, ``xla``, ...), or the accelerator (or
            that index of it) is not available on this machine.
    """
    parsed = parse_device(device)
    name = str(device).strip() if isinstance(device, str) else str(device)
    if parsed.type == "cpu":
        return parsed
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {name!r} asked for, but torch sees no CUDA device here; use cpu"
            )
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(
                f"device {name!r} asked for, but torch sees {count} CUDA device(s) "
                f"(cuda:0..cuda:{count - 1}); pick one of those"
            )
        return parsed
    if parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"device {name!r} asked for, but MPS is not available here; use cpu")
        return parsed
    raise AssertionError(parsed)  # parse_device admits the supported types only


def parse_device(device: Any) -> torch.device:
    """Parse a device name, refusing one that is not a device or of a type mechlab does
    not run on, without asking whether this machine has it (a sweep's trials may run on
    another machine's GPU).

    Raises:
        ValueError: One line, as :func:`check_device`.
    """
    if isinstance(device, torch.device):
        name = str(device)
    elif isinstance(device, str):
        name = device.strip()
    else:
        raise ValueError(
            f"device must be a name such as 'cpu' or 'cuda:0', got a {type(device).__name__}"
        )
    try:
        parsed = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(
            f"unknown device {name!r}; use one of {', '.join(SUPPORTED)} (cuda:N for one GPU)"
        ) from None
    if parsed.type not in SUPPORTED:
        raise ValueError(
            f"mechlab does not run on device type {parsed.type!r}; use one of {', '.join(SUPPORTED)}"
        )
    return parsed
