"""Cache the default model's greedy outputs for the chat workloads.

The simulator's summarization / rag / mtbench workloads need the true output of
the real model: this runs Gemma 3 270M's ``model.generate(do_sample=False)`` on
the first N first-turn prompts of each category and writes one JSON per prompt
to ``benchmarks/cache/outputs/<sha256(prompt text)[:20]>.json`` with
``prompt_ids``, ``output_ids`` (eos excluded) and the settings used. Prompts
already cached are skipped, so the script can be interrupted and rerun.

    nice -n 10 python -m benchmarks.make_outputs --categories summarization,rag --limit 10

Category ``edits-model``: the edit prompts from pair ``workloads.EDITS_MODEL_FIRST`` on (original
file as reference), up to ``--max-new-tokens`` (use 512, as e2e.py's edits) by refdec's
``SpeculativeDecoder`` in editing mode: the same tokens as ``model.generate`` greedy (refdec's
tests and every e2e run assert it), several times faster on a CPU. The first 3 decoded in a run are
also decoded by ``model.generate`` and compared; a difference stops the script.

    python -m benchmarks.make_outputs --categories edits-model --limit 30 --max-new-tokens 512
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks import data, workloads
from benchmarks.report import write_json


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--categories", default="summarization,rag,mtbench")
    ap.add_argument("--limit", type=int, default=10, help="prompts per category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=2048,
                    help="skip prompts longer than this many tokens")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from refdec.models import load_default

    model, tok = load_default()
    eos = tok.eos_token_id
    end_of_turn = tok.convert_tokens_to_ids("<end_of_turn>")
    stop_ids = [t for t in (eos, end_of_turn) if isinstance(t, int) and t >= 0]
    workloads.OUTPUTS_DIR.mkdir(parents=True, exist_ok=True)

    for category in [c for c in args.categories.split(",") if c]:
        if category == "edits-model":
            make_edit_outputs(model, tok, args)
            continue
        done = 0
        for i, question in enumerate(data.chat_questions(category)):
            if done >= args.limit:
                break
            text = workloads.chat_prompt(question)
            path = workloads.OUTPUTS_DIR / f"{workloads.prompt_key(text)}.json"
            if path.exists():
                done += 1
                continue
            ids = tok(text, return_tensors="pt").input_ids
            if ids.shape[1] > args.max_prompt_tokens:
                print(f"{category}/{i}: prompt of {ids.shape[1]} tokens skipped", flush=True)
                continue
            t0 = time.time()
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                                     eos_token_id=stop_ids, pad_token_id=eos)
            new = out[0, ids.shape[1]:].tolist()
            while new and new[-1] in stop_ids:
                new.pop()
            rec = {
                "category": category, "index": i, "prompt_ids": ids[0].tolist(), "output_ids": new,
                "model": "gemma-3-270m", "dtype": "float32", "max_new_tokens": args.max_new_tokens,
                "do_sample": False,
            }
            write_json(path, rec, indent=None)
            done += 1
            print(f"{category}/{i}: {ids.shape[1]} prompt + {len(new)} new tokens in "
                  f"{time.time() - t0:.1f}s", flush=True)
    return 0


def make_edit_outputs(model, tok, args, checked: int = 3) -> None:
    """Caches the default model's greedy output for the edit pairs (``edits-model`` workload)."""
    import torch

    from refdec import SpeculativeDecoder

    decoder = SpeculativeDecoder(model, tok)
    done = compared = 0
    for case in workloads.load_edits().cases[workloads.EDITS_MODEL_FIRST:]:
        if done >= args.limit:
            break
        path = workloads.edits_model_path(case)
        if path.exists():
            done += 1
            continue
        if len(case.prompt) > args.max_prompt_tokens:
            print(f"edits-model {case.name}: prompt of {len(case.prompt)} tokens skipped", flush=True)
            continue
        ids = torch.tensor([case.prompt.tolist()], dtype=torch.long)
        t0 = time.time()
        out = decoder.generate(ids, references=[r.tolist() for r in case.references],
                               max_new_tokens=args.max_new_tokens)
        new = out.sequences[0, ids.shape[1]:].tolist()
        seconds = time.time() - t0
        if compared < checked:
            compared += 1
            with torch.no_grad():
                want = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                                      pad_token_id=tok.eos_token_id)[0, ids.shape[1]:].tolist()
            if new != want:
                raise SystemExit(f"edits-model {case.name}: refdec's output differs from model.generate greedy")
        rec = {"category": "edits-model", "case": case.name, "prompt_ids": case.prompt.tolist(),
               "output_ids": new, "model": "gemma-3-270m", "dtype": "float32",
               "max_new_tokens": args.max_new_tokens, "do_sample": False, "decoder": "refdec (lossless)"}
        write_json(path, rec, indent=None)
        done += 1
        print(f"edits-model {case.name}: {len(case.prompt)} prompt + {len(new)} new tokens in {seconds:.1f}s",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
