"""``refdec build-llama``: llama-cpp-python with ggml's batch-invariant matrix products, so that
refdec's output on llama.cpp is plain decoding's, bit for bit (refdec.llama_cpp.build).

    refdec build-llama [--jobs N] [--rebuild] [--sdist FILE] [--no-install]

Downloads llama-cpp-python's pinned source, applies refdec's patch to the llama.cpp it vendors,
builds it (about 10 minutes on 2 cores; the wheel is cached) and installs it into this Python.
"""

from __future__ import annotations

import sys
from pathlib import Path


def register(subparsers) -> None:
    """Add the ``build-llama`` command to the ``refdec`` parser."""
    p = subparsers.add_parser(
        "build-llama",
        help="build and install llama-cpp-python with the patch that makes refdec exact on llama.cpp",
        description="Build llama-cpp-python from its pinned source with refdec's patch to ggml's CPU backend "
                    "(a switch for batch-invariant matrix products, which refdec turns on for its verification "
                    "decodes: its output is then llama.cpp's plain decoding's, bit for bit) and install it into "
                    "this Python. The wheel is cached; a second run installs it without building.",
    )
    p.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel compile jobs (default: the CPU count)")
    p.add_argument("--rebuild", action="store_true", help="build again even if a patched wheel is cached")
    p.add_argument("--sdist", type=Path, default=None, metavar="FILE",
                   help="a llama-cpp-python sdist already on disk (default: pip downloads the pinned version)")
    p.add_argument("--no-install", dest="install", action="store_false",
                   help="build (or find) the wheel and print its path, without installing it")
    p.set_defaults(handler=run)


def run(args) -> int:
    from refdec.llama_cpp.build import build_llama

    try:
        wheel = build_llama(jobs=args.jobs, install=args.install, rebuild=args.rebuild, sdist=args.sdist)
    except RuntimeError as exc:
        print(f"refdec build-llama: error: {exc}", file=sys.stderr)
        return 1
    print(wheel)
    return 0
