"""Plot an e2e.py result: speed-up over HF greedy per workload and method (median, min-max bars),
and the cost curve it ran under.

    python -m benchmarks.plot RESULTS.json [MORE.json ...] [--out benchmarks/out/e2e-main.png]

Several result files (e.g. edits and the chat workloads run separately) are merged into one
figure; the cost curve shown is the first file's (with a lazy head: backbone + one head chunk).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = [json.loads(Path(path).read_text()) for path in args.results]
    data = runs[0]
    summary, workloads, methods = {}, [], []
    for run in runs:
        summary.update(run["summary"])
        workloads += [w for w in run["workloads"] if w not in workloads]
        methods += [m for m in run["methods"] if m != "hf-greedy" and m not in methods]
    new_tokens = sorted({str(run["args"].get("edits_max_new_tokens") or run["args"]["max_new_tokens"])
                         if "edits" in run["workloads"] else str(run["args"]["max_new_tokens"]) for run in runs})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(methods)
    x = np.arange(len(workloads))
    for i, method in enumerate(methods):
        med, lo, hi = [], [], []
        for wl in workloads:
            s = summary.get(f"{wl}/{method}")
            if s is None or s["ratio_median"] is None:
                med.append(np.nan), lo.append(0), hi.append(0)
                continue
            med.append(s["ratio_median"])
            lo.append(s["ratio_median"] - s["ratio_min"])
            hi.append(s["ratio_max"] - s["ratio_median"])
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, med, width, yerr=[lo, hi], capsize=2, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x, workloads)
    ax.set_ylabel("speed-up over HF greedy (median, min-max)")
    threads = data.get("machine", {}).get("torch_threads")
    ax.set_title(f"Gemma 3 270M fp32, CPU {threads} thread(s), {'/'.join(new_tokens)} new tokens, "
                 "outputs identical to HF greedy")
    ax.legend(fontsize=8)
    curve = data["cost_curve"]
    head = curve.get("head_chunk_seconds") or 0.0  # lazy head: one chunk of visited rows per step
    seconds = [s + head for s in curve["seconds"]]
    ax2.plot(curve["nodes"], [s / seconds[0] for s in seconds], marker="o",
             label="measured (this CPU)" + (", + 1 head chunk" if head else ""))
    ax2.plot(curve["nodes"], [1.0] * len(curve["nodes"]), linestyle="--", label="flat (GPU-like)")
    ax2.set_xlabel("draft nodes verified")
    ax2.set_ylabel("forward cost / plain-decoding forward")
    ax2.set_title("cost curve")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    out = Path(args.out) if args.out else Path(args.results[0]).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
