"""A sweep: one instruction applied file after file, with refdec's memory of past outputs off and on.

    python -m benchmarks.memory_sweep --files 6 --threads 2 --json benchmarks/out/memory_sweep.json

The editor model (Qwen2.5-Coder-1.5B-Instruct, llama.cpp) rewrites ``--files`` modules of the
Python standard library (1,000-2,500 characters, a fixed pick) with one instruction, as a coding
agent applying a change across a codebase would: one request per file, through ``refdec edit``'s
chat prompt, the file as the reference (``prediction``) and, in a second pass, without it (the
file only in the prompt). Each file is decoded by two decoders over one llama.cpp context (no
prefix cache, so neither reuses the other's prompt): ``off`` without a memory, ``on`` with an
:class:`refdec.OutputMemory` that every earlier file's output joined. Prints per file tokens/s,
passes and the tokens the memory drafted, the on/off speed-up and whether the outputs agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import time
from pathlib import Path

import numpy as np

INSTRUCTION = ("Add a module docstring at the very top of the file: a first line saying what the module is for, "
               "then a blank line, then the line 'Part of the Example Corp toolkit; released under the MIT License.'")


def stdlib_files(count: int, low: int = 1000, high: int = 2500, seed: int = 0) -> list[Path]:
    """``count`` standard-library modules of ``low``..``high`` characters, a fixed pick."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "encodings"}  # tests, installed packages, codec tables
    files = sorted(p for p in lib.rglob("*.py") if low <= p.stat().st_size <= high
                   and not skip & set(p.relative_to(lib).parts) and p.name not in ("this.py", "__init__.py"))
    order = np.random.default_rng(seed).permutation(len(files))
    return [files[i] for i in order[:count]]


def run(args) -> list[dict]:
    import llama_cpp
    import torch

    import refdec
    from refdec.edit_prompt import build_chat_edit_prompt
    from refdec.gguf_files import editor_model_gguf

    torch.set_num_threads(args.threads)
    llm = llama_cpp.Llama(str(editor_model_gguf()), n_ctx=4096, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)
    off = refdec.SpeculativeDecoder(llm, prefix_cache=0)
    decoders = {"off": off, "on": refdec.SpeculativeDecoder(llm, backend=off.backend, memory=refdec.OutputMemory())}
    tokenizer = decoders["off"].tokenizer
    records = []
    for with_prediction in (True, False):
        for path in stdlib_files(args.files):
            original = path.read_text()
            prompt = build_chat_edit_prompt(original, INSTRUCTION, tokenizer)
            ids = tokenizer.encode(prompt.text, add_special_tokens=False)
            record = {"file": str(path.relative_to(Path(sysconfig.get_paths()["stdlib"]))), "prediction": with_prediction, "prompt_tokens": len(ids)}
            for name, decoder in decoders.items():
                t0 = time.perf_counter()
                out = decoder.generate([ids], references=[original] if with_prediction else None,
                                       max_new_tokens=args.max_new_tokens, stop_strings=[prompt.stop])
                seconds = time.perf_counter() - t0
                stats = out.stats
                record[name] = {"tokens": out.sequences[0, len(ids):].tolist(), "seconds": seconds,
                                "new_tokens": stats.new_tokens, "passes": stats.forward_passes,
                                "prefill_seconds": stats.prefill_seconds,
                                "memory_accepted": stats.accepted_by_source.get("memory", 0)}
            on, off = record["on"], record["off"]
            record["speedup"] = (on["new_tokens"] / on["seconds"]) / (off["new_tokens"] / off["seconds"])
            record["identical"] = on["tokens"] == off["tokens"]
            records.append(record)
            print(f"{record['file']} prediction={with_prediction}: off {off['new_tokens']} tokens "
                  f"{off['passes']} passes {off['seconds']:.1f} s; on {on['passes']} passes {on['seconds']:.1f} s, "
                  f"memory drafted {on['memory_accepted']}; {record['speedup']:.2f}x, "
                  f"identical {record['identical']}", flush=True)
    return records


def markdown(records: list[dict]) -> str:
    lines = ["| request | files | tokens (median) | passes off / on (sum) | memory-drafted tokens (sum) | "
             "on / off tok/s (median, min, max) | identical |", "|---|---|---|---|---|---|---|"]
    for with_prediction in (True, False):
        rows = [r for r in records if r["prediction"] == with_prediction]
        if not rows:
            continue
        ups = [r["speedup"] for r in rows]
        lines.append(f"| {'file as prediction' if with_prediction else 'file in the prompt only'} | {len(rows)} | "
                     f"{statistics.median(r['off']['new_tokens'] for r in rows):.0f} | "
                     f"{sum(r['off']['passes'] for r in rows)} / {sum(r['on']['passes'] for r in rows)} | "
                     f"{sum(r['on']['memory_accepted'] for r in rows)} | "
                     f"{statistics.median(ups):.2f}x, {min(ups):.2f}x, {max(ups):.2f}x | "
                     f"{sum(r['identical'] for r in rows)}/{len(rows)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.files < 1:
        ap.error(f"--files must be >= 1, got {args.files}")
    records = run(args)
    print(markdown(records))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "records": records}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
