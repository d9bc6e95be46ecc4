"""``refdec calibrate``: measure a model's verification cost against draft size ahead of time.

    refdec calibrate [--model DIR] [--threads N] [--force]

``max_draft_tokens="auto"`` (the default of ``generate`` and ``edit``) needs this curve;
the first call that needs it measures it (announced on stderr) and caches it per model,
dtype, device and thread count. Running it ahead of time keeps that out of a first
timed run. Prints the curve (milliseconds per verification forward at each draft size). A
curve whose repeated rounds disagree (a busy machine) is used but not saved; it says so.
"""

from __future__ import annotations

import sys

from refdec.cli.common import set_threads


def register(subparsers) -> None:
    """Add the ``calibrate`` command to the ``refdec`` parser."""
    p = subparsers.add_parser(
        "calibrate",
        help="measure the model's verification cost against draft size (cached; 'auto' drafting uses it)",
        description="Measure how long a verification forward takes at each draft-tree size on this machine, for "
                    "the given model, dtype and thread count, and cache it (max_draft_tokens='auto' reads it).",
    )
    p.add_argument("--model", metavar="DIR", default=None,
                   help="model directory, or a model name in the local Hugging Face cache (default: Gemma 3 270M)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads to calibrate for (default: torch's; the curve is cached per thread count)")
    p.add_argument("--force", action="store_true", help="measure again even if a curve is cached")
    p.set_defaults(handler=run)


def run(args) -> int:
    from refdec.transformers import calibration  # not at the top: `refdec --help` stays fast (torch, transformers)
    from refdec.models import load_default, load_model

    set_threads(args.threads)
    model, _ = load_default() if args.model is None else load_model(args.model)
    cached = None if args.force else calibration.load_cached(model)
    curve = cached if cached is not None else calibration.calibrate(model, force=True)
    where = calibration.calibration_path(model)
    if cached is not None:
        state = "cached"
    else:  # a curve whose rounds disagree is not saved (refdec.sizing.cost_curve.repeats_disagree)
        state = "measured, not saved (busy machine)" if (curve.meta or {}).get("disagreement") else "measured"
    print(f"[refdec calibrate] {state}: {where}", file=sys.stderr)
    head = (f"; LM head {1000 * curve.head_chunk_seconds:.1f} ms per {curve.head_chunk_rows} visited rows"
            if curve.lazy_head else "")
    print(f"draft nodes: ms per verification forward{head}")
    for nodes, seconds in zip(curve.nodes, curve.seconds):
        print(f"{nodes:>5}: {1000 * seconds:8.1f}")
    return 0
