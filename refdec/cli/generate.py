"""``refdec generate``: speculative generation from the command line, streamed.

    refdec generate --prompt TEXT | --prompt-file FILE | --prompts-jsonl FILE [--max-batch-size B]
                    [--model NAME|DIR|F.gguf] [--engine llama.cpp|transformers] [--index FILE]
                    [--reference FILE]... [--retrieve K] [--max-new-tokens N]
                    [--sample [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]]
                    [--repetition-penalty R] [--no-repeat-ngram-size N]
                    [--max-draft-tokens N|auto] [--stop STRING]...

One prompt: streams the generated text to stdout (transformers' TextStreamer), then
prints a stats line (tokens, passes, tokens/pass, tokens/s) to stderr.

Many prompts (``--prompts-jsonl``, one JSON object a line: ``{"prompt": TEXT}``, with
an optional ``"references": [TEXT, ...]`` of its own): decoded as one batch, at most
``--max-batch-size`` rows together (continuous batching); writes one JSON object a
line to stdout, in input order: ``{"line", "completion", "new_tokens",
"stop_reason", "tokens_per_pass"}`` (row ``i`` of a sampled batch uses seed ``S + i``).
"""

from __future__ import annotations

import argparse
import json
import sys

from refdec import gguf_files
from refdec.cli.common import (add_model_arguments, check_input_file, draft_tokens, jsonl_lines, load_model_arg,
                               read_text_file, set_threads)
from refdec.engine.defaults import MAX_NEW_TOKENS


def register(subparsers) -> None:
    """Add the ``generate`` command to the ``refdec`` parser."""
    p = subparsers.add_parser(
        "generate",
        help="generate text with retrieval-based speculative decoding",
        description="Generate text losslessly (same output as plain decoding) with drafts from the prompt, "
                    "reference files and a corpus index; streams the text, then prints decoding stats.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    src.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a file")
    src.add_argument("--prompts-jsonl", metavar="FILE",
                     help='many prompts, one JSON object a line: {"prompt": TEXT, "references": [TEXT, ...]}; '
                          "writes one JSON object a line (the completions, in order)")
    p.add_argument("--max-batch-size", type=int, default=None, metavar="B",
                   help="with --prompts-jsonl: rows decoded together; the others join as rows finish (default 4)")
    add_model_arguments(p, f"{gguf_files.DEFAULT_MODEL_NAME} on transformers")
    p.add_argument("--index", metavar="FILE", default=None, help="a corpus index file (refdec index build)")
    p.add_argument("--reference", metavar="FILE", action="append", default=[],
                   help="a reference document to draft from (repeatable), e.g. the file being edited")
    p.add_argument("--retrieve", type=int, default=0, metavar="K",
                   help="also draft from the K documents of --index most similar to the prompt "
                        "(needs the MinHash signatures `refdec index build` stores in it; default 0)")
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, metavar="N",
                   help="tokens to generate at most (default %(default)s)")
    p.add_argument("--sample", action="store_true", help="sample instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=None, metavar="T", help="with --sample (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="with --sample: keep the K most likely tokens (default: off)")
    p.add_argument("--top-p", type=float, default=None, metavar="P",
                   help="with --sample: keep the most likely tokens up to probability mass P (default: off)")
    p.add_argument("--min-p", type=float, default=None, metavar="P",
                   help="with --sample: drop tokens less likely than P times the most likely one (default: off)")
    p.add_argument("--repetition-penalty", type=float, default=None, metavar="R",
                   help="penalise tokens already in the text, as model.generate does (default: the model's "
                        "generation_config)")
    p.add_argument("--no-repeat-ngram-size", type=int, default=None, metavar="N",
                   help="never repeat an N-gram, as model.generate does (default: the model's generation_config)")
    p.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed (default: random)")
    p.add_argument("--max-draft-tokens", type=draft_tokens, default="auto", metavar="N|auto",
                   help="draft tree size per step: an integer (0 = plain decoding) or 'auto' (default)")
    p.add_argument("--stop", action="append", default=None, metavar="STRING",
                   help="stop once the text contains STRING, which stays in the output (repeatable)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: torch's, one per core; on a busy machine fewer is faster)")
    p.set_defaults(handler=run)


def _read(path: str) -> str:
    return read_text_file(path)


def read_prompts_jsonl(path: str) -> list[dict]:
    """The requests of a ``--prompts-jsonl`` file: ``[{"prompt": str, "references": [str, ...]}]``.
    ValueError names the line of a malformed request."""
    requests = []
    text = _read(path)
    text = text[1:] if text.startswith("\ufeff") else text  # a UTF-8 byte-order mark, as some editors write
    for line_no, line in enumerate(jsonl_lines(text), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{line_no}: not a JSON object ({exc.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f'{path}:{line_no}: expected an object with a "prompt" string, got {line.strip()[:80]!r}')
        refs = item.get("references", [])
        if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
            raise ValueError(f'{path}:{line_no}: "references" must be a list of strings')
        unknown = set(item) - {"prompt", "references"}
        if unknown:
            raise ValueError(f"{path}:{line_no}: unknown keys {sorted(unknown)} (known: prompt, references)")
        requests.append({"prompt": item["prompt"], "references": refs, "where": f"{path}:{line_no}"})
    if not requests:
        raise ValueError(f"{path}: no prompts (one JSON object a line)")
    return requests


def run(args) -> int:
    from refdec import SpeculativeDecoder  # not at the top: `refdec --help` stays fast

    if args.retrieve < 0:
        raise ValueError(f"--retrieve must be >= 0, got {args.retrieve}")
    if args.retrieve and not args.index:
        raise ValueError(f"--retrieve {args.retrieve} needs --index FILE (the corpus to retrieve documents from)")
    if args.index:
        check_input_file(args.index, "--index")
    if args.max_batch_size is not None and not args.prompts_jsonl:
        raise ValueError("--max-batch-size applies to --prompts-jsonl (one prompt decodes alone)")
    if args.max_batch_size is None:
        args.max_batch_size = 4
    if args.max_batch_size < 1:
        raise ValueError(f"--max-batch-size must be >= 1, got {args.max_batch_size}")
    set_threads(args.threads)
    if not args.sample:
        given = [flag for flag, value in (("--temperature", args.temperature), ("--top-k", args.top_k),
                                          ("--top-p", args.top_p), ("--min-p", args.min_p),
                                          ("--seed", args.seed)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --sample "
                             f"(without it decoding is greedy)")
    _check_flags(args)
    if args.temperature is None:
        args.temperature = 1.0
    requests = read_prompts_jsonl(args.prompts_jsonl) if args.prompts_jsonl else None
    prompt = None
    if requests is None:
        prompt = args.prompt if args.prompt is not None else _read(args.prompt_file)
    references = [_read(f) for f in args.reference]
    model, tokenizer, _ = load_model_arg(args.model, args.threads, args.engine)
    index = None
    if args.index:
        from refdec.drafting.index import CorpusIndex

        index = CorpusIndex.load(args.index, tokenizer)
    decoder = SpeculativeDecoder(model, tokenizer=tokenizer, index=index, exact=args.exact)
    if requests is not None:
        return _run_batch(args, decoder, tokenizer, requests, references)
    from transformers import TextStreamer

    input_ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    out = decoder.generate(
        input_ids, references=references or None, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        **_logits_settings(args),
        stop_strings=args.stop, streamer=streamer, max_draft_tokens=args.max_draft_tokens,
        retrieve=args.retrieve,
    )
    s = out.stats
    seed = f", seed {s.seed}" if s.seed is not None else ""
    retrieved = f"; retrieved documents {s.retrieved_documents}" if s.retrieved_documents else ""
    if args.retrieve and not s.retrieved_documents:
        retrieved = "; retrieved no documents (none of the index shares enough of the prompt's n-grams)"
    print(f"\n[refdec] {s.summary()}{seed}; stop: {s.stop_reason}{retrieved}", file=sys.stderr)
    return 0


def _check_flags(args) -> None:
    """The numeric flags' ranges, checked before any work and named as typed (the API's own
    checks would name its parameters)."""
    checks = [
        ("--max-new-tokens", args.max_new_tokens, lambda v: v >= 0, ">= 0"),
        ("--temperature", args.temperature, lambda v: v > 0 and v != float("inf"), "> 0 (and finite)"),
        ("--top-k", args.top_k, lambda v: v >= 1, ">= 1"),
        ("--top-p", args.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
        ("--min-p", args.min_p, lambda v: 0 <= v <= 1, "in [0, 1]"),
        ("--seed", args.seed, lambda v: v >= 0, ">= 0"),
        ("--repetition-penalty", args.repetition_penalty, lambda v: 0 < v < float("inf"), "> 0 (and finite)"),
        ("--no-repeat-ngram-size", args.no_repeat_ngram_size, lambda v: v >= 0, ">= 0"),
    ]
    for flag, value, ok, wanted in checks:
        if value is not None and not ok(value):
            raise ValueError(f"{flag} must be {wanted}, got {value}")
    for stop in args.stop or []:
        if not stop:
            raise ValueError("--stop must be a non-empty string")


def _logits_settings(args) -> dict:
    """The logits-setting flags given, as generate's keyword arguments (the others keep the model's)."""
    settings = {"repetition_penalty": args.repetition_penalty, "no_repeat_ngram_size": args.no_repeat_ngram_size}
    return {name: value for name, value in settings.items() if value is not None}


def _run_batch(args, decoder, tokenizer, requests: list[dict], references: list[str]) -> int:
    """``--prompts-jsonl``: every request in one batched call; one JSON line per request, in
    input order, each written (and flushed) as soon as it and every request before it finished,
    so an interrupted run keeps the completions it wrote."""
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in requests]
    for request, ids in zip(requests, prompts):  # named by file and line, before any decoding
        if not ids:
            raise ValueError(f"{request['where']}: the prompt is empty (it tokenizes to no tokens)")
        if decoder.max_positions is not None and len(ids) > decoder.max_positions:
            raise ValueError(f"{request['where']}: the prompt has {len(ids)} tokens, more than the model's "
                             f"max_position_embeddings={decoder.max_positions}")
    # per-row references: the row's own, plus the --reference files shared by all rows
    refs = [(r["references"] + references) or None for r in requests]
    finished: dict[int, str] = {}
    next_line = 0

    def write_in_order(batch_row: int, new_tokens: list[int], row) -> None:
        nonlocal next_line
        completion = tokenizer.decode(new_tokens, skip_special_tokens=True)
        finished[batch_row] = json.dumps({"line": batch_row, "completion": completion, "new_tokens": row.new_tokens,
                                          "stop_reason": row.stop_reason,
                                          "tokens_per_pass": round(row.tokens_per_pass, 3)})
        while next_line in finished:
            print(finished.pop(next_line), flush=True)
            next_line += 1

    out = decoder.generate(
        prompts, references=refs, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        **_logits_settings(args),
        stop_strings=args.stop, max_draft_tokens=args.max_draft_tokens, retrieve=args.retrieve,
        max_batch_size=args.max_batch_size, on_row_done=write_in_order,
    )
    if next_line != len(requests):
        raise RuntimeError(f"internal error: {len(requests) - next_line} completions were not written")
    s = out.stats
    prompts_word = "prompt" if len(requests) == 1 else "prompts"
    print(f"[refdec] {len(requests)} {prompts_word}, at most {args.max_batch_size} together: {s.summary()} "
          f"(summed over the rows)", file=sys.stderr)
    return 0
