"""Where the benchmarks write: the repository, the cache and the results folders.

    CACHE_DIR  benchmarks/cache/ (``$REFDEC_BENCH_CACHE`` overrides): token ids, the default
               model's cached outputs (``outputs/``), corpus indexes. Derived data only:
               deleting it costs a rebuild, never a result.
    OUT_DIR    benchmarks/out/: result JSON (``report.write_result``).

Both are git-ignored. The data the benchmarks read is elsewhere (``data.data_dir()``).
"""

from __future__ import annotations

import os
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
CACHE_DIR = Path(os.environ.get("REFDEC_BENCH_CACHE", BENCH_DIR / "cache"))
OUT_DIR = BENCH_DIR / "out"
