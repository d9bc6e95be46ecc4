"""A sweep: one instruction applied file after file, with refdec's memory of past outputs off and on.

    python -m benchmarks.memory_sweep --files 6 --threads 2 --json benchmarks/out/memory_sweep.json
    python -m benchmarks.memory_sweep --agent --files 6 --threads 2 --json benchmarks/out/memory_agent.json

The editor model (Qwen2.5-Coder-1.5B-Instruct, llama.cpp) rewrites ``--files`` modules of the
Python standard library (1,000-2,500 characters, a fixed pick) with one instruction, as a coding
agent applying a change across a codebase would: one request per file, through ``refdec edit``'s
chat prompt, the file as the reference (``prediction``) and, in a second pass, without it (the
file only in the prompt). Each file is decoded by two decoders over one llama.cpp context (no
prefix cache, so neither reuses the other's prompt): ``off`` without a memory, ``on`` with an
:class:`refdec.OutputMemory` that every earlier file's output joined. Prints per file tokens/s,
passes and the tokens the memory drafted, the on/off speed-up and whether the outputs agree.

``--agent``: a scripted agent does the same task on each file in a fresh conversation of JSON tool
calls (:data:`AGENT_SYSTEM`): the task, the model's ``read_file`` call, the file as the tool's
result, the model's ``write_file`` call (the new file as a JSON string), ``ok``, the model's last
word. Each request is decoded by both decoders; the next request is built from the ``off`` reply,
so both see the same requests. No prediction: an agent's client sends none.
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


AGENT_SYSTEM = ("You are a coding agent. You act only through tools, one call per reply, written as one JSON "
                "object and nothing else: {\"tool\": \"read_file\", \"path\": PATH} returns a file; "
                "{\"tool\": \"write_file\", \"path\": PATH, \"content\": TEXT} replaces it; "
                "{\"tool\": \"done\", \"summary\": TEXT} ends the task.")


def agent_turns(path: str, original: str):
    """The scripted side of one task: yields the next user or tool message for each model reply
    (None first), None when the task is over."""
    reply = yield {"role": "user", "content": f"Task: {INSTRUCTION} The file is {path}."}
    reply = yield {"role": "user", "content": f"Tool result for read_file {path}:\n{original}"}
    reply = yield {"role": "user", "content": f"Tool result for write_file {path}: ok"}
    del reply
    yield None


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
    # untimed: the first decode of a context pays its one-time set-up (without a memory: nothing joins it)
    off.generate([tokenizer.encode("def main():", add_special_tokens=False)], max_new_tokens=16)
    if args.agent:
        return run_agent(args, decoders, tokenizer)
    records = []
    for with_prediction in (True, False):
        for path in stdlib_files(args.files):
            original = path.read_text()
            prompt = build_chat_edit_prompt(original, INSTRUCTION, tokenizer)
            ids = tokenizer.encode(prompt.text, add_special_tokens=False)
            record = decode_both(decoders, ids, args.max_new_tokens,
                                 references=[original] if with_prediction else None, stop_strings=[prompt.stop])
            record.update(file=str(path.relative_to(Path(sysconfig.get_paths()["stdlib"]))),
                          prediction=with_prediction, prompt_tokens=len(ids))
            on, off = record["on"], record["off"]
            records.append(record)
            print(f"{record['file']} prediction={with_prediction}: off {off['new_tokens']} tokens "
                  f"{off['passes']} passes {off['seconds']:.1f} s; on {on['passes']} passes {on['seconds']:.1f} s, "
                  f"memory drafted {on['memory_accepted']}; {record['speedup']:.2f}x, "
                  f"identical {record['identical']}", flush=True)
    return records


def decode_both(decoders: dict, ids: list[int], max_new_tokens: int, references=None, stop_strings=None) -> dict:
    """One request by each decoder: {"off"|"on": {tokens, seconds, new_tokens, passes, prefill_seconds,
    memory_accepted}}, and the on / off speed-up and whether they agree."""
    record = {}
    for name, decoder in decoders.items():
        t0 = time.perf_counter()
        out = decoder.generate([ids], references=references, max_new_tokens=max_new_tokens, stop_strings=stop_strings)
        seconds = time.perf_counter() - t0
        stats = out.stats
        record[name] = {"tokens": out.sequences[0, len(ids):].tolist(), "seconds": seconds,
                        "new_tokens": stats.new_tokens, "passes": stats.forward_passes,
                        "prefill_seconds": stats.prefill_seconds,
                        "memory_accepted": stats.accepted_by_source.get("memory", 0)}
    on, off = record["on"], record["off"]
    record["speedup"] = (on["new_tokens"] / on["seconds"]) / (off["new_tokens"] / off["seconds"])
    # the decode alone: both prefill the same prompt, which the memory cannot shorten
    record["decode_speedup"] = (off["seconds"] - off["prefill_seconds"]) / (on["seconds"] - on["prefill_seconds"])
    record["identical"] = on["tokens"] == off["tokens"]
    return record


def run_agent(args, decoders: dict, tokenizer) -> list[dict]:
    """``--agent``: each file's task as a conversation (:func:`agent_turns`), every request decoded
    by both decoders, the conversation going on with the ``off`` reply."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    records = []
    for path in stdlib_files(args.files):
        script = agent_turns(str(path.relative_to(lib)), path.read_text())
        messages = [{"role": "system", "content": AGENT_SYSTEM}, next(script)]
        for turn in range(3):
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            record = decode_both(decoders, ids, args.max_new_tokens)
            record.update(file=str(path.relative_to(lib)), turn=turn, prompt_tokens=len(ids), prediction=False)
            records.append(record)
            reply = tokenizer.decode(record["off"]["tokens"], skip_special_tokens=True)
            print(f"{record['file']} turn {turn}: {record['off']['new_tokens']} tokens, passes off "
                  f"{record['off']['passes']} on {record['on']['passes']}, memory drafted "
                  f"{record['on']['memory_accepted']}; {record['speedup']:.2f}x, identical {record['identical']}",
                  flush=True)
            messages.append({"role": "assistant", "content": reply})
            following = script.send(reply)
            if following is None:
                break
            messages.append(following)
    return records


TABLE_HEAD = ["| {what} | {count} | tokens (median) | passes off / on (sum) | memory-drafted tokens (sum) | "
              "on / off tok/s (median, min, max) | after the prefill | identical |", "|---|---|---|---|---|---|---|---|"]


def _table_row(name: str, rows: list[dict]) -> str:
    """One line of the tables: ``rows``' records summed and their medians."""
    ups = [r["speedup"] for r in rows]
    return (f"| {name} | {len(rows)} | {statistics.median(r['off']['new_tokens'] for r in rows):.0f} | "
            f"{sum(r['off']['passes'] for r in rows)} / {sum(r['on']['passes'] for r in rows)} | "
            f"{sum(r['on']['memory_accepted'] for r in rows)} | "
            f"{statistics.median(ups):.2f}x, {min(ups):.2f}x, {max(ups):.2f}x | "
            f"{statistics.median(r['decode_speedup'] for r in rows):.2f}x | "
            f"{sum(r['identical'] for r in rows)}/{len(rows)} |")


def markdown(records: list[dict]) -> str:
    lines = [TABLE_HEAD[0].format(what="request", count="files"), TABLE_HEAD[1]]
    for with_prediction in (True, False):
        rows = [r for r in records if r["prediction"] == with_prediction]
        if rows:
            lines.append(_table_row("file as prediction" if with_prediction else "file in the prompt only", rows))
    return "\n".join(lines)


def agent_markdown(records: list[dict]) -> str:
    lines = [TABLE_HEAD[0].format(what="turn", count="requests"), TABLE_HEAD[1]]
    for turn, name in enumerate(("read_file call", "write_file call (the new file)", "done")):
        rows = [r for r in records if r["turn"] == turn]
        if rows:
            lines.append(_table_row(name, rows))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--agent", action="store_true", help="the agent loop instead of the sweep")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.files < 1:
        ap.error(f"--files must be >= 1, got {args.files}")
    records = run(args)
    print(agent_markdown(records) if args.agent else markdown(records))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "records": records}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
