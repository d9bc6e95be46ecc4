"""``refdec edit``: rewrite a file as an instruction asks, drafting from the original.

    refdec edit FILE --instruction TEXT [--model NAME|DIR|F.gguf] [--engine llama.cpp|transformers]
                [--out FILE | --in-place] [--prompt-template NAME|F]
                [--max-new-tokens N] [--max-draft-tokens N|auto] [--compare] [--diff] [--threads N]
    refdec edit FILE --instruction TEXT --server URL [--api-key KEY] [--model ID] [--out FILE | --in-place] [--diff]

The model is the editor model (Qwen2.5-Coder-1.5B-Instruct, ``refdec[editor]``) unless
``--model`` names another; it runs on llama.cpp when llama-cpp-python is installed. The prompt
(refdec.edit_prompt) holds the file and the instruction, through the model's chat template when
it has one; generation stops at the closing code fence. The original file is passed as a reference, and
the proposer runs in editing mode (a copy cursor follows the output through the
original), so unchanged stretches are verified many tokens per forward pass.

Output: the rewritten file goes to ``--out`` (or replaces FILE, ``--in-place``, keeping its mode),
written atomically and only when the reply closed the file's fence; else it is streamed to stdout
(unless ``--diff`` without ``--out``: then only the diff is printed). ``--diff`` prints the
unified diff of the result against the original to stdout. Stats (tokens/pass,
accepted fraction, wall time) go to stderr; ``--compare`` also decodes plainly
(one token per pass) and reports the speed-up, failing if the outputs differ.

``--server URL``: a running OpenAI-compatible server decodes instead (refdec.cli.edit_remote).
"""

from __future__ import annotations

import difflib
import sys
import time
from pathlib import Path

from refdec import gguf_files
from refdec.atomic import atomic_write
from refdec.cli.common import add_model_arguments, check_output_path, draft_tokens, load_model_arg, read_text_file, set_threads
from refdec.edit_prompt import CHAT_TEMPLATE, TEMPLATES, build_chat_edit_prompt, build_edit_prompt

EDITOR_MODEL = gguf_files.EDITOR_MODEL_NAME  # refdec edit's default model


def register(subparsers) -> None:
    """Add the ``edit`` command to the ``refdec`` parser."""
    p = subparsers.add_parser(
        "edit",
        help="rewrite a file as an instruction asks (drafts copied from the original)",
        description="Rewrite FILE following --instruction with greedy decoding; the original file is the draft "
                    "reference, so unchanged parts are verified many tokens per pass. Output is identical to plain "
                    "greedy decoding.",
    )
    p.add_argument("file", metavar="FILE", help="the file to rewrite")
    p.add_argument("--instruction", required=True, metavar="TEXT", help="what to change")
    add_model_arguments(p, f"{EDITOR_MODEL}, the editor model (refdec[editor]), on llama.cpp when installed")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="FILE", default=None,
                       help="write the rewritten file here, only once it is complete (default: stdout)")
    where.add_argument("--in-place", action="store_true",
                       help="replace FILE with the rewritten file (its mode kept), atomically and only once it is "
                            "complete")
    p.add_argument("--prompt-template", metavar="NAME|F", default=None,
                   help="a template name ('chat': through the model's chat template, the default for a model that "
                        "has one; original-change (the default for a base model), commit, rewrite) or a file holding "
                        "a format string with {original}, {instruction}, {path}, {fence}")
    p.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                   help="generation limit (default: twice the file's tokens + 64)")
    p.add_argument("--max-draft-tokens", type=draft_tokens, default="auto", metavar="N|auto",
                   help="draft tree size per pass: an integer (0 = plain decoding) or 'auto' (default)")
    p.add_argument("--compare", action="store_true",
                   help="also decode without drafts (about doubles the run time), check the outputs are identical "
                        "(exit status 1 if not) and print the speed-up")
    p.add_argument("--diff", action="store_true",
                   help="print the unified diff of the result against the original (without --out, only the diff "
                        "is printed)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads, torch's or llama.cpp's (default: the engine's; on a busy machine fewer is "
                        "faster)")
    p.add_argument("--server", metavar="URL", default=None,
                   help="send the edit, the file as its `prediction`, to a running OpenAI-compatible server "
                        "(refdec serve, or vLLM with refdec's proposer: many edits share one loaded model); --model "
                        "is then the server's model id (default: its first)")
    p.add_argument("--api-key", metavar="KEY", default=None,
                   help="with --server: the server's API key (default: $REFDEC_API_KEY or $OPENAI_API_KEY)")
    p.set_defaults(handler=run)


def _read(path: str) -> str:
    return read_text_file(path)


def _template(value: str | None) -> str | None:
    if value is None or value in TEMPLATES or value == CHAT_TEMPLATE:
        return value
    if not Path(value).exists():
        raise ValueError(f"--prompt-template {value}: neither a template name ({', '.join(TEMPLATES)}) nor a file")
    return _read(value)


class _FenceStreamer:
    """A transformers-style streamer (put/end) that writes the generated text up
    to the closing fence, holding back a tail that could be its beginning."""

    def __init__(self, tokenizer, stop: str, out) -> None:
        self.tokenizer, self.stop, self.out = tokenizer, stop, out
        self.ids: list[int] = []
        self.written = 0
        self.skipped_prompt = False
        self.done = False

    def put(self, value) -> None:
        if not self.skipped_prompt:  # the first put is the prompt
            self.skipped_prompt = True
            return
        self.ids.extend(int(t) for t in value.reshape(-1).tolist())
        self._flush(final=False)

    def end(self) -> None:
        self._flush(final=True)

    def _flush(self, final: bool) -> None:
        if self.done:
            return
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = text.find(self.stop)
        if cut >= 0:
            upto, self.done = cut, True
        else:
            upto = len(text) if final else max(self.written, len(text) - len(self.stop))
            if not final and upto > 0 and text[upto - 1] == "\ufffd":  # an incomplete multi-byte character
                upto -= 1
        if upto > self.written:
            self.out.write(text[self.written:upto])
            self.out.flush()
            self.written = upto


def _write_diff(path: str, original: str, result: str) -> None:
    """``--diff``: the unified diff of ``result`` against ``original`` on stdout (a last line
    without a newline marked as ``diff -u`` marks it)."""
    name = Path(path).name
    changed = False
    for line in difflib.unified_diff(original.splitlines(keepends=True), result.splitlines(keepends=True),
                                     fromfile=f"a/{name}", tofile=f"b/{name}"):
        sys.stdout.write(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        changed = True
    sys.stdout.flush()
    if not changed:
        print("[refdec edit] --diff: no changes (the result equals the original)", file=sys.stderr)


def _plain(decoder, on_llama: bool, tokenizer, input_ids, common: dict) -> tuple[list[int], float]:
    """``--compare``'s baseline, what a user would run instead: the new tokens and the seconds of
    plain greedy decoding, ending at the model's eos or the stop string as refdec's decode ends.
    On llama.cpp that is llama.cpp's own one-token decoding (refdec.llama_cpp.plain), on
    transformers refdec's loop without drafts (one token per forward, as ``model.generate``)."""
    if not on_llama:
        out = decoder.generate(input_ids, max_draft_tokens=0, **common)
        return out.sequences[0, input_ids.shape[1]:].tolist(), out.stats.wall_seconds
    from refdec.llama_cpp.plain import plain_greedy

    stops = common["stop_strings"] or []
    eos = set(decoder.backend.generation_config.eos_token_id or [])

    def stopped(new: list[int]) -> bool:
        return any(stop in tokenizer.decode(new[-64:]) for stop in stops)

    return plain_greedy(decoder.model, input_ids[0].tolist(), common["max_new_tokens"], eos,
                        stopped if stops else None)


def _warm_up(decoder, on_llama: bool, tokenizer, input_ids, max_draft_tokens, common: dict) -> None:
    """Before ``--compare`` times both methods: the costs only a process's first decode pays
    (the cost curve, measured once per machine; the weights' first touch; the allocator's and
    the kernels' first calls) are paid here, untimed, by a short decode that takes both paths
    (the prompt's prefill, then tree steps and one-token steps)."""
    t0 = time.perf_counter()
    settings = {**common, "max_new_tokens": 4, "stop_strings": None}
    decoder.generate(input_ids, max_draft_tokens=max_draft_tokens, **settings)
    _plain(decoder, on_llama, tokenizer, input_ids, settings)
    decoder.backend.clear_prefix_cache()  # both timed decodes prefill the prompt from scratch, as a user's first
    print(f"[refdec edit] warm-up before timing: {time.perf_counter() - t0:.2f} s", file=sys.stderr)


def run(args) -> int:
    import refdec  # not at the top: `refdec --help` stays fast (torch, transformers)

    set_threads(args.threads)
    if not args.instruction.strip():
        raise ValueError("--instruction must be a non-empty text")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.in_place:
        args.out = args.file
        check_output_path(args.out, "--in-place", replaced=True)
    elif args.out is not None:
        check_output_path(args.out)
    original = _read(args.file)
    if args.server is not None:
        from refdec.cli import edit_remote

        return edit_remote.run(args, original, lambda before, after: _write_diff(args.file, before, after))
    if args.api_key is not None:
        raise ValueError("--api-key goes with --server")
    template = _template(args.prompt_template)
    model, tokenizer, engine = load_model_arg(args.model or EDITOR_MODEL, args.threads, args.engine)
    on_llama = engine == "llama.cpp"
    if template is None and getattr(tokenizer, "chat_template", None):
        template = CHAT_TEMPLATE  # an instruct model: its own chat format
    if template == CHAT_TEMPLATE:
        prompt = build_chat_edit_prompt(original, args.instruction, tokenizer)
        input_ids = tokenizer(prompt.text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    else:
        prompt = build_edit_prompt(original, args.instruction, path=Path(args.file).name, template=template)
        input_ids = tokenizer(prompt.text, return_tensors="pt")["input_ids"]
    file_tokens = len(tokenizer(original, add_special_tokens=False)["input_ids"])
    max_new = args.max_new_tokens if args.max_new_tokens is not None else 2 * file_tokens + 64
    if max_new < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new}")

    stream_to_stdout = args.out is None and not args.diff
    streamer = _FenceStreamer(tokenizer, prompt.stop, sys.stdout) if stream_to_stdout else None
    # one decoder for every decode of the command (on llama.cpp: one verification context); the
    # original file is the reference, so the proposer follows it with its copy cursor
    decoder = refdec.SpeculativeDecoder(model, tokenizer=tokenizer, exact=args.exact)
    # eos_token_id None: the model's own (an instruct model's reply ends with its end-of-turn token)
    common = dict(tokenizer=tokenizer, references=[original], stop_strings=[prompt.stop],
                  max_new_tokens=max_new, eos_token_id=None)
    if args.compare:
        _warm_up(decoder, on_llama, tokenizer, input_ids, args.max_draft_tokens, common)
    out = decoder.generate(input_ids, streamer=streamer, max_draft_tokens=args.max_draft_tokens, **common)
    wall = out.stats.wall_seconds  # without the one-time calibration ("auto": refdec calibrate)
    new_ids = out.sequences[0, input_ids.shape[1]:].tolist()
    generated = tokenizer.decode(new_ids, skip_special_tokens=True)
    result = prompt.extract(generated)
    s = out.stats
    if not prompt.complete(generated):
        if s.stop_reason == "max_new_tokens":
            what = f"stopped at --max-new-tokens {max_new} before the closing fence"
        else:
            what = f"the model ended its reply ({s.stop_reason}) before the closing fence"
        rest = f"Raise --max-new-tokens (the file is {file_tokens} tokens) to get the whole file."
        if args.out is not None:  # a partial file is never written
            print(f"[refdec edit] error: {what} after {s.new_tokens} tokens; nothing was written and {args.file} is "
                  f"unchanged. {rest}", file=sys.stderr)
            return 1
        print(f"[refdec edit] warning: {what}: what follows is the partial result. {rest}", file=sys.stderr)

    if args.out is not None:
        atomic_write(Path(args.out), [result.encode("utf-8")])  # line endings as generated
    elif stream_to_stdout and not result.endswith("\n"):
        sys.stdout.write("\n")
    elif args.out is None and not args.diff:
        sys.stdout.write(result if result.endswith("\n") else result + "\n")
    if args.diff:
        _write_diff(args.file, original, result)

    frac = s.accepted_tokens / s.proposed_tokens if s.proposed_tokens else 0.0
    # verification accepts drafted tokens past the closing fence too; the output stops at the fence
    past_stop = " (some past the closing fence)" if s.accepted_tokens > s.new_tokens else ""
    exact = on_llama and bool(getattr(decoder.backend, "exact", False))
    mode = " (exact mode)" if exact else " (trees)" if on_llama else ""
    print(f"[refdec edit] {s.new_tokens} tokens in {s.forward_passes} passes on {engine}{mode}: {s.tokens_per_pass:.2f} "
          f"tokens/pass, accepted {s.accepted_tokens}/{s.proposed_tokens} drafted tokens ({frac:.0%}){past_stop}, "
          f"{wall:.2f} s ({s.new_tokens / wall if wall > 0 else 0.0:.1f} tokens/s; prefill {s.prefill_seconds:.2f} s"
          f"{f' with {s.cached_prompt_tokens} prompt tokens cached' if s.cached_prompt_tokens else ''}, decode "
          f"{wall - s.prefill_seconds:.2f} s); stop: {s.stop_reason}",
          file=sys.stderr)
    if args.compare:
        plain_ids, plain_wall = _plain(decoder, on_llama, tokenizer, input_ids, common)
        same = plain_ids == new_ids
        if on_llama:
            agree = next((i for i, (a, b) in enumerate(zip(new_ids, plain_ids)) if a != b),
                         min(len(new_ids), len(plain_ids)))
            print(f"[refdec edit] llama.cpp plain greedy (Llama.generate): {len(plain_ids)} tokens in "
                  f"{plain_wall:.2f} s; speed-up {plain_wall / wall if wall > 0 else float('nan'):.2f}x; "
                  f"tokens agreeing: {agree}/{max(len(new_ids), len(plain_ids))}; outputs identical: {same}",
                  file=sys.stderr)
            if not same and exact:  # exact mode promises plain decoding's tokens: a difference is a defect
                print("refdec: error: refdec's output in exact mode differs from llama.cpp's plain decoding",
                      file=sys.stderr)
                return 1
            if not same:
                print("[refdec edit] llama.cpp's batched and one-token evaluations round differently: the outputs "
                      "part where the model's top two tokens were nearly tied; `refdec build-llama` builds the "
                      "llama.cpp that makes them identical (exact mode, docs/llama_cpp.md)", file=sys.stderr)
            return 0
        print(f"[refdec edit] plain greedy: {len(plain_ids)} tokens in {plain_wall:.2f} s; speed-up "
              f"{plain_wall / wall if wall > 0 else float('nan'):.2f}x; outputs identical: {same}", file=sys.stderr)
        if not same:
            print("refdec: error: speculative and plain greedy outputs differ", file=sys.stderr)
            return 1
    return 0
