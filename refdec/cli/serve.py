"""``refdec serve``: a local OpenAI-compatible server that takes Predicted Outputs.

    refdec serve [--model NAME|DIR|F.gguf] [--engine llama.cpp|transformers] [--index CORPUS.refdec]
                 [--host 127.0.0.1] [--port 8000] [--served-model-name NAME ...] [--api-key KEY]
                 [--max-concurrent N] [--max-waiting N] [--ctx N] [--prefix-cache N] [--threads N]
                 [--no-implicit-reference]

The editor model on llama.cpp by default. Every request decodes as one row of one running batch
(refdec.engine.service) with its own settings; its ``prediction`` drafts as its reference (without
one, the largest fenced code block of its messages: refdec.drafting.implicit). The
API key may come from the environment (``REFDEC_API_KEY``) rather than the command line, where
other users of the machine could read it. docs/serve.md shows clients.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from refdec import gguf_files
from refdec.cli.common import GGUF_CONTEXT, add_model_arguments, check_input_file, is_gguf, load_model_arg, set_threads
from refdec.drafting.tree import MAX_NODES
from refdec.engine.defaults import MAX_CONCURRENT, MAX_WAITING, PREFIX_CACHE_ENTRIES
from refdec.serve.corpora import CorpusRegistry, parse_index_argument

SERVE_INSTALL_HINT = "pip install 'refdec[serve]'"
API_KEY_ENV = "REFDEC_API_KEY"
DEFAULT_CONTEXT = GGUF_CONTEXT  # tokens per request: prompt + completion
# the prefill chunk: exact mode reuses a cached prompt in whole chunks (refdec.llama_cpp.backend)
PREFILL_CHUNK = 128


def register(subparsers) -> None:
    """Add the ``serve`` command to the ``refdec`` parser."""
    p = subparsers.add_parser(
        "serve", help="an OpenAI-compatible server that accepts Predicted Outputs (`prediction`)",
        description="Serve a model over OpenAI's HTTP API (/v1/chat/completions, /v1/completions, /v1/models, "
                    "/health). A request's `prediction` is drafted from, so edits come out many tokens per pass; "
                    "the output is what plain decoding gives. Concurrent requests decode in one batch.")
    add_model_arguments(p, f"{gguf_files.EDITOR_MODEL_NAME}, the editor model (refdec[editor]), on llama.cpp when "
                           f"installed")
    p.add_argument("--index", metavar="[NAME=]CORPUS.refdec", action="append", default=[],
                   help="a corpus index (refdec index build) under NAME (default: the file's stem); several may be "
                        "given; the first drafts for every request that names none (its `corpus` field: "
                        "extra_body={'corpus': NAME}; '' for none)")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="the port (default: 8000)")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the model ids the server answers to (default: the model's name); some clients send "
                        "`prediction` only for ids they allow-list")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV} when set, else none)")
    p.add_argument("--max-concurrent", type=int, default=MAX_CONCURRENT, metavar="N",
                   help="requests decoding together in one batch (default: %(default)s)")
    p.add_argument("--max-waiting", type=int, default=MAX_WAITING, metavar="N",
                   help="requests queued behind them before the server answers 503 (default: %(default)s)")
    p.add_argument("--ctx", type=int, default=DEFAULT_CONTEXT, metavar="N",
                   help=f"tokens per request, prompt and completion together (default: {DEFAULT_CONTEXT})")
    p.add_argument("--prefix-cache", type=int, default=PREFIX_CACHE_ENTRIES, metavar="N",
                   help="finished requests whose KV cache is kept, so that a prompt beginning as one of theirs "
                        "did (the same file or system prompt, a chat's earlier turns) is not prefilled again "
                        "(default: %(default)s; 0: none)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads, llama.cpp's or torch's (default: one per core)")
    p.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK, metavar="N",
                   help="prompts are prefilled in chunks of N tokens (llama.cpp's n_batch); in exact mode a "
                        "prompt reuses an earlier one's cache in whole chunks, so smaller chunks reuse more of it "
                        "(default: %(default)s)")
    p.add_argument("--no-implicit-reference", action="store_true",
                   help="a request without `prediction` drafts from its context alone (by default also from "
                        "the largest fenced code block of its messages: the file an editing tool put there)")
    p.add_argument("--memory-mb", type=float, default=64.0, metavar="MB",
                   help="past outputs kept to draft later requests from, at most this many MiB in all, oldest "
                        "dropped first (default: 64; 0: none)")
    p.add_argument("--shared-memory", action="store_true",
                   help="every request drafts from every earlier output (by default each API key, or each "
                        "request's `user` where there is no key, has its own: a reply's speed would show "
                        "whether its text was in someone else's output)")
    p.set_defaults(handler=run)


def _check(args) -> None:
    for flag, value, least in (("--max-concurrent", args.max_concurrent, 1), ("--max-waiting", args.max_waiting, 0),
                               ("--ctx", args.ctx, 16), ("--prefix-cache", args.prefix_cache, 0),
                               ("--prefill-chunk", args.prefill_chunk, 16)):
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    if not 0 <= args.memory_mb <= 1 << 20:
        raise ValueError(f"--memory-mb must be in 0..{1 << 20}, got {args.memory_mb}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    indexes = [parse_index_argument(value) for value in args.index]
    names = [name for name, _ in indexes]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"--index: the name {name!r} is given twice")
    for _, path in indexes:
        check_input_file(path, "--index")
    if args.served_model_name is not None and any(not name.strip() for name in args.served_model_name):
        raise ValueError("--served-model-name: a name must not be empty")


def run(args) -> int:
    _check(args)
    try:
        import uvicorn

        from refdec.serve.app import create_app
    except ImportError as error:
        raise ImportError(f"refdec serve needs {error.name}: {SERVE_INSTALL_HINT}") from None
    import refdec
    from refdec.engine.service import DecodingService

    set_threads(args.threads)
    model_name = args.model or gguf_files.EDITOR_MODEL_NAME
    # every request's row has a slot of --ctx cells and room for its draft tree
    cells = args.max_concurrent * (args.ctx + MAX_NODES + 1)
    print(f"refdec serve: loading {model_name}", file=sys.stderr)
    model, tokenizer, engine = load_model_arg(model_name, args.threads, args.engine, n_ctx=cells,
                                              n_batch=args.prefill_chunk)
    corpora = CorpusRegistry()
    for value in args.index:
        from refdec.drafting.index import CorpusIndex

        name, path = parse_index_argument(value)
        corpora.add(name, CorpusIndex.load(path, tokenizer), "file")
    index = corpora.index_for(None)
    memory = refdec.OutputMemory(int(args.memory_mb * (1 << 20))) if args.memory_mb > 0 else None
    decoder = refdec.SpeculativeDecoder(model, tokenizer=tokenizer, index=index, max_rows=args.max_concurrent,
                                        prefix_cache=args.prefix_cache, memory=memory, exact=args.exact,
                                        prefill_chunk=args.prefill_chunk)
    limit = decoder.max_positions
    context = args.ctx if limit is None else min(args.ctx, limit + 1)
    service = DecodingService(decoder, max_concurrent=args.max_concurrent, max_waiting=args.max_waiting)
    names = args.served_model_name or [Path(model_name).stem if is_gguf(model_name) else model_name]
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    app = create_app(service, model_names=names, context_length=context, api_key=api_key,
                     implicit_references=not args.no_implicit_reference, shared_memory=args.shared_memory,
                     corpora=corpora)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    print(f"refdec serve: {names[0]} on {engine}, {args.max_concurrent} concurrent requests of up to {context} "
          f"tokens, at http://{args.host}:{args.port}/v1 (models: {', '.join(names)}; API key: "
          f"{'required' if api_key else 'none'})", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        service.close()
    return 0
