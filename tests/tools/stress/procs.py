"""What a stress run may leave behind: processes and /dev/shm entries of its namespace."""

from __future__ import annotations

import os
from pathlib import Path


def processes_naming(namespace: str) -> list[int]:
    """Live processes other than this one whose command line holds `namespace`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if namespace.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def shm_entries(namespace: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if f"gearshift.{namespace}." in n]
