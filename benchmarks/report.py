"""Writing results: the one JSON writer, the run record every result carries, markdown tables.

Every benchmark writes its result with :func:`write_result`, which adds

    git_commit  the checkout's HEAD (None outside a git checkout)
    git_dirty   True when tracked files differ from HEAD (the numbers are not HEAD's alone)
    command     the command line, as ``python -m benchmarks.<name> ARGS`` (shell-quoted)
    argv        the arguments alone (list of str)
    machine     python, platform, processor, cpu_count, affinity, torch_threads
                (torch.get_num_threads() if the run imported torch, else None),
                torch version

Results go to ``paths.OUT_DIR`` (benchmarks/out/) unless a path is given.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from benchmarks.paths import BENCH_DIR, OUT_DIR
RUN_KEYS = ("git_commit", "git_dirty", "command", "argv", "machine")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=BENCH_DIR, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """The HEAD commit of the checkout holding the benchmarks, or None."""
    return _git("rev-parse", "HEAD") or None


def git_dirty() -> bool | None:
    """Whether tracked files differ from HEAD (None outside a git checkout)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def machine_info() -> dict:
    """What the numbers depend on besides the code: interpreter, CPU, torch's threads."""
    torch = sys.modules.get("torch")
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch": getattr(torch, "__version__", None),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
    }


def result_path(json_arg: str | None, name: str, *, timestamp: bool = True) -> Path:
    """``json_arg`` (a script's ``--json``) if given, else ``OUT_DIR/<name>[-<time>].json``."""
    if json_arg:
        return Path(json_arg)
    return OUT_DIR / (f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json" if timestamp else f"{name}.json")


def write_json(path: Path | str, obj, *, indent: int | None = 1) -> Path:
    """Writes ``obj`` as JSON to ``path`` under a temporary name, then renames it (a killed run
    leaves no half-written file); creates the folder. Values JSON cannot hold are written as str."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent, default=str) + "\n")
    os.replace(tmp, path)
    return path


def write_result(path: Path | str, payload: dict, *, argv: Sequence[str] | None = None) -> Path:
    """Writes a benchmark's ``payload`` with the run record (RUN_KEYS) to ``path``.

    ``argv``: the arguments the script parsed (default ``sys.argv[1:]``). ``payload`` must not
    hold the run record's keys (ValueError naming them)."""
    clash = [key for key in RUN_KEYS if key in payload]
    if clash:
        raise ValueError(f"payload must not hold the run record's keys {clash}: write_result adds them")
    args = [str(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)  # None when run as a file
    launcher = ["python", "-m", main_spec.name] if main_spec else ["python", sys.argv[0]]
    record = {"git_commit": git_commit(), "git_dirty": git_dirty(), "command": shlex.join(launcher + args),
              "argv": args, "machine": machine_info()}
    return write_json(path, {**payload, **record})


def percentile_us(samples_s: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``samples_s`` (seconds), in microseconds."""
    return float(np.percentile(np.asarray(samples_s, dtype=np.float64), q) * 1e6)


def markdown_table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
