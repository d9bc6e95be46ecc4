"""End-to-end runs on llama.cpp (``e2e.py --backend llama.cpp``): refdec against what a llama.cpp
user runs, side by side in one process.

Methods (each prompt runs every method in turn, so machine noise hits them alike):

* ``plain``  -- llama.cpp's plain greedy decoding (``Llama.generate`` at temperature 0);
* ``lookup`` -- llama-cpp-python's prompt lookup (``LlamaPromptLookupDecoding(num_pred_tokens=10)``,
  a second ``Llama`` with ``logits_all=True``, as it requires);
* ``refdec`` -- ``refdec.generate(llm, ...)``, ``max_draft_tokens="auto"`` (the backend's cost
  curve is measured before any timing), references = the file being edited;
* ``refdec-hf`` (``--transformers``) -- refdec on the same model in transformers, float32 (the
  models converted once by refdec.models), fed the same prompt ids;
* ``refdec-trees`` (``--trees``) -- refdec with exact mode off (``exact=False``: trees, equal to
  plain up to llama.cpp's batched roundings), beside ``refdec`` in exact mode (the default where
  llama-cpp-python was built by ``refdec build-llama``);
* ``refdec-loaded`` / ``refdec-loaded-fixed`` (``--load-curve``) -- refdec whose cost curve was
  measured while two busy processes ran (:func:`curve_under_load`), then run quiet like the others:
  with the curve refit from the steps' times (``timed_budget``, the default) and without; against
  ``refdec``, whose curve was measured quiet (issue 36: a curve measured under load must correct
  itself within a decode).
* ``refdec-memory`` (``--memory``) -- refdec with a memory of past outputs (``refdec.OutputMemory``)
  that each prompt's output joins after its run (the decoder's own outputs, as a server keeps them):
  the requests after the first draft from every earlier one's output too (issue 44: on unrelated
  requests the memory must cost nothing).

Workloads (``../shared/data``, read at run time), each with its model (benchmarks/backends.py):

* ``gemma-edits``  -- Gemma 3 270M (the README's model), the edits of ``edits-click.jsonl`` through
  refdec's base-model edit prompt;
* ``coder-edits``  -- Qwen2.5-Coder-1.5B-Instruct (the editor model), the same edits with each
  commit message as the instruction, as ``refdec edit`` asks it (refdec.edit_prompt's chat prompt:
  the reply begun with the fence, ending at the closing fence); ``coder-0.5b-edits`` the same with
  Qwen2.5-Coder-0.5B-Instruct;
* ``chat``         -- SmolLM2-135M-Instruct, MT-Bench first turns through its chat template
  (``--chat-category``: a Spec-Bench category's instead).

``--held-out`` takes each workload's last ``--limit`` prompts instead of its first: the edits and
questions no setting of refdec was tuned on (the tuning runs read the first ones; keep it so).

Per prompt and method: the speed-up over ``plain`` end to end (the prefill included, as a user
sees it, at plain's output length: outputs that part at a near-tie end at different lengths) and
after the prefill (what drafting changes; plain's prefill is timed by a one-token run of the same
prompt), tokens/pass (refdec), and the agreement with ``plain`` (identical, or the first
differing position).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from benchmarks.backends import load_model
from benchmarks.data import chat_questions
from benchmarks.methods import first_difference
from benchmarks.workloads import edit_outcome, editor_edit_rows

# workload: the model it runs (benchmarks/backends.py)
WORKLOADS = {"gemma-edits": "default", "coder-edits": "editor", "coder-0.5b-edits": "editor-small", "chat": "chat"}


def prompts_for(workload: str, tokenizer, limit: int, max_file_chars: int, held_out: bool = False,
                chat_category: str = "mtbench") -> list[dict]:
    """[{"name", "ids", "references"}] for ``workload``: edits with files of 1,000..max chars, or
    ``chat_category``'s first turns; the first ``limit`` in file order, or with ``held_out`` the
    last ``limit`` (the held-out set: prompts no setting was ever tuned on)."""
    out = []
    if workload == "chat":
        questions = chat_questions(chat_category)
        first = max(0, len(questions) - limit) if held_out else 0
        for i in range(first, min(len(questions), first + limit)):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": questions[i]}], tokenize=True)
            out.append({"name": f"{chat_category}-{i}", "ids": ids, "references": []})
        return out
    from refdec.edit_prompt import build_chat_edit_prompt, build_edit_prompt

    rows = editor_edit_rows(None, max_file_chars)
    for row in rows[-limit:] if held_out else rows[:limit]:
        if workload == "gemma-edits":
            prompt = build_edit_prompt(row["before"], row["message"], path=Path(row["path"]).name)
            ids = tokenizer.encode(prompt.text)
        else:  # as refdec edit asks an instruct model
            prompt = build_chat_edit_prompt(row["before"], row["message"], tokenizer)
            ids = tokenizer.encode(prompt.text, add_special_tokens=False)
        out.append({"name": row["path"] + "@" + row["commit"][:7], "ids": ids, "references": [row["before"]],
                    "original": row["before"], "stop": prompt.stop})
    return out


def run_workload(workload: str, args) -> list[dict]:
    """Every prompt of ``workload`` through each method: one record per prompt."""
    import llama_cpp

    import refdec
    from refdec.llama_cpp.plain import plain_greedy

    model = WORKLOADS[workload]
    llm, _ = load_model(model, "llama.cpp", threads=args.threads, n_ctx=args.n_ctx)
    lookup, _ = load_model(model, "llama.cpp", threads=args.threads, n_ctx=args.n_ctx, logits_all=True,
                           draft_model=llama_cpp.llama_speculative.LlamaPromptLookupDecoding(num_pred_tokens=10))
    decoders = {"refdec": refdec.SpeculativeDecoder(llm, prefix_cache=0)}  # each prompt prefilled from scratch, as plain
    tokenizer = decoders["refdec"].tokenizer
    eos = set(decoders["refdec"].backend.generation_config.eos_token_id or [])
    prompts = prompts_for(workload, tokenizer, args.limit, args.max_file_chars, args.held_out, args.chat_category)
    if args.transformers:  # refdec on transformers (float32), the same prompt ids: the models share the vocabulary
        decoders["refdec-hf"] = refdec.SpeculativeDecoder(*load_model(model, "transformers"), prefix_cache=0)
    if args.trees:
        decoders["refdec-trees"] = refdec.SpeculativeDecoder(llm, prefix_cache=0, exact=False)
    if args.load_curve:
        loaded = curve_under_load(llm)
        for method, timed in (("refdec-loaded", True), ("refdec-loaded-fixed", False)):
            decoders[method] = refdec.SpeculativeDecoder(llm, prefix_cache=0)
            decoders[method].backend._cost_curve = loaded  # what auto_cost_curve gives this decoder
            decoders[method].timed_budget = timed
    if getattr(args, "memory", False):
        decoders["refdec-memory"] = refdec.SpeculativeDecoder(llm, prefix_cache=0, memory=refdec.OutputMemory())
    for decoder in decoders.values():
        decoder.generate(prompts[0]["ids"], max_new_tokens=8)  # the cost curve (once, cached) and first touches
    if "refdec-memory" in decoders:
        decoders["refdec-memory"].memory.clear()  # the warm-up's output; each prompt's joins after its run
    plain_greedy(llm, prompts[0]["ids"], 8)
    plain_greedy(lookup, prompts[0]["ids"], 8)
    records = []
    for prompt in prompts:
        ids, n = prompt["ids"], args.max_new_tokens
        row = {"workload": workload, "prompt": prompt["name"], "prompt_tokens": len(ids)}
        _, prefill = plain_greedy(llm, ids, 1, eos)  # the prompt's prefill and one token: taken off below
        plain, seconds = plain_greedy(llm, ids, n, eos)
        row["plain"] = {"tokens": len(plain), "seconds": seconds, "prefill_seconds": prefill}
        if "original" in prompt:  # does the model edit, or copy the file (the easy case)?
            row["plain"]["edit"] = edit_outcome(tokenizer.decode(plain, skip_special_tokens=True), prompt["stop"],
                                                prompt["original"])
        looked, seconds = plain_greedy(lookup, ids, n, eos)
        row["lookup"] = {"tokens": len(looked), "seconds": seconds, "agree": _agreement(looked, plain)}
        for method, decoder in decoders.items():
            out = decoder.generate(ids, references=prompt["references"] or None, max_new_tokens=n,
                                   eos_token_id=sorted(eos) or None)
            new = out.sequences[0, len(ids):].tolist()
            s = out.stats
            row[method] = {"tokens": len(new), "seconds": s.wall_seconds, "prefill_seconds": s.prefill_seconds,
                           "passes": s.forward_passes, "tokens_per_pass": s.tokens_per_pass, "head_rows": s.head_rows,
                           "drafted": s.proposed_tokens, "accepted": s.accepted_tokens,
                           "accepted_by_source": s.accepted_by_source, "agree": _agreement(new, plain),
                           "exact": bool(getattr(decoder.backend, "exact", False))}
        records.append(row)
        print(_line(row), file=sys.stderr, flush=True)
    llm.close()
    lookup.close()
    return records


def curve_under_load(llm, busy: int = 2):
    """The llama.cpp cost curve of ``llm`` measured (refdec.llama_cpp.calibration.measure, not
    cached) while ``busy`` processes spin on the CPU."""
    import subprocess

    import refdec
    from refdec.llama_cpp.calibration import measure

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        curve = measure(refdec.SpeculativeDecoder(llm, prefix_cache=0).backend)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    print(f"curve under load: one entry {curve(0) * 1e3:.0f} ms, 16 nodes {curve(16) * 1e3:.0f} ms, "
          f"64 nodes {curve(64) * 1e3:.0f} ms", file=sys.stderr, flush=True)
    return curve


def load_curve_table(records: list[dict]) -> str:
    """``--load-curve``: per workload, the speed-up over plain of refdec with the curve measured quiet,
    and with the curve measured under load (refit on / off), and the ratio to the quiet curve's."""
    lines = ["| workload | refdec, quiet curve / plain (median, min) | curve under load, refit / plain (median, min) "
             "| ratio to the quiet curve's (median, min) | curve under load, no refit / plain (median, min) "
             "| ratio (median, min) |", "|---|---|---|---|---|---|"]
    for workload in WORKLOADS:
        rows = [r for r in records if r["workload"] == workload and "refdec-loaded" in r]
        if not rows:
            continue
        cells = []
        quiet = [_speedup(r, "refdec") for r in rows]
        cells.append(f"{statistics.median(quiet):.2f}x, {min(quiet):.2f}x")
        for method in ("refdec-loaded", "refdec-loaded-fixed"):
            ours = [_speedup(r, method) for r in rows]
            ratio = [o / q for o, q in zip(ours, quiet)]
            cells.append(f"{statistics.median(ours):.2f}x, {min(ours):.2f}x")
            cells.append(f"{statistics.median(ratio):.2f}, {min(ratio):.2f}")
        lines.append(f"| {workload} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def exact_table(records: list[dict]) -> str:
    """``--trees``: per workload, identity with plain and the speed-up of refdec in exact mode (the
    ``refdec`` method) and with trees (``refdec-trees``), side by side."""
    lines = ["| workload | prompts | exact mode | identical to plain: exact, trees | exact / plain (median, min) "
             "| trees / plain (median, min) | exact / trees (median, min) | tokens/pass: exact, trees |",
             "|---|---|---|---|---|---|---|---|"]
    for workload in WORKLOADS:
        rows = [r for r in records if r["workload"] == workload and "refdec-trees" in r]
        if not rows:
            continue
        exact = [_speedup(r, "refdec") for r in rows]
        trees = [_speedup(r, "refdec-trees") for r in rows]
        ratio = [e / t for e, t in zip(exact, trees)]
        same = [sum(r[m]["agree"]["identical"] for r in rows) for m in ("refdec", "refdec-trees")]
        tpp = [statistics.median(r[m]["tokens_per_pass"] for r in rows) for m in ("refdec", "refdec-trees")]
        lines.append(f"| {workload} | {len(rows)} | {rows[0]['refdec'].get('exact')} | {same[0]}/{len(rows)}, "
                     f"{same[1]}/{len(rows)} | {statistics.median(exact):.2f}x, {min(exact):.2f}x | "
                     f"{statistics.median(trees):.2f}x, {min(trees):.2f}x | {statistics.median(ratio):.2f}, "
                     f"{min(ratio):.2f} | {tpp[0]:.2f}, {tpp[1]:.2f} |")
    return "\n".join(lines)


def memory_table(records: list[dict]) -> str:
    """``--memory``: per workload, refdec with a memory of the earlier prompts' outputs against refdec
    without one and against plain, and the tokens the memory drafted."""
    lines = ["| workload | prompts | refdec + memory / refdec (median, min) | refdec + memory / plain (median, min) "
             "| refdec / plain (median, min) | memory-drafted tokens accepted | identical to plain |",
             "|---|---|---|---|---|---|---|"]
    for workload in WORKLOADS:
        rows = [r for r in records if r["workload"] == workload and "refdec-memory" in r][1:]  # after the first
        if not rows:
            continue
        ours = [_speedup(r, "refdec-memory") for r in rows]
        base = [_speedup(r, "refdec") for r in rows]
        ratio = [o / b for o, b in zip(ours, base)]
        drafted = sum(r["refdec-memory"]["accepted_by_source"].get("memory", 0) for r in rows)
        same = sum(r["refdec-memory"]["agree"]["identical"] for r in rows)
        lines.append(f"| {workload} | {len(rows)} | {statistics.median(ratio):.2f}, {min(ratio):.2f} | "
                     f"{statistics.median(ours):.2f}x, {min(ours):.2f}x | {statistics.median(base):.2f}x, "
                     f"{min(base):.2f}x | {drafted} | {same}/{len(rows)} |")
    return "\n".join(lines)


def _agreement(tokens: list[int], reference: list[int]) -> dict:
    first = first_difference(tokens, reference)
    return {"identical": first is None, "first_difference": first}


def _rate(cell: dict) -> float:
    """Tokens/s as a user sees them: the prompt's prefill included."""
    return cell["tokens"] / cell["seconds"] if cell["seconds"] > 0 else 0.0


def _speedup(row: dict, method: str) -> float:
    """``method``'s end-to-end speed-up over plain decoding at plain's length: plain's seconds over the
    method's prefill plus plain's tokens at the method's decode rate (outputs that part at a near-tie
    end at different lengths, and a short one would carry its prefill over fewer tokens)."""
    plain, cell = row["plain"], row[method]
    if plain["tokens"] <= 1:  # an answer of one token: the prefill alone
        return plain["seconds"] / cell["seconds"] if cell["seconds"] > 0 else 0.0
    prefill = cell.get("prefill_seconds", plain["prefill_seconds"])  # lookup's prefill is plain's
    rate = _decode_rate({**cell, "prefill_seconds": prefill})
    return plain["seconds"] / (prefill + (plain["tokens"] - 1) / rate) if rate > 0 else 0.0


def _decode_rate(cell: dict) -> float:
    """Tokens/s after the first token (the prefill yields it): what drafting changes. Outputs that
    part at a near-tie differ in length, and the prefill would weigh on the shorter one."""
    seconds = cell["seconds"] - cell["prefill_seconds"]
    return (cell["tokens"] - 1) / seconds if seconds > 0 else 0.0


def _line(row: dict) -> str:
    plain = _rate(row["plain"])
    parts = [f"{row['workload']} {row['prompt']}: plain {plain:.1f} tok/s"]
    for method in ("lookup", "refdec"):
        cell = row[method]
        parts.append(f"{method} {_speedup(row, method):.2f}x" + ("" if cell["agree"]["identical"] else
                                                                  f" (differs at {cell['agree']['first_difference']})"))
    if _decode_rate(row["plain"]) > 0:  # plain may stop after its first token
        parts.append(f"refdec after the prefill {_decode_rate(row['refdec']) / _decode_rate(row['plain']):.2f}x")
    if "refdec-memory" in row:
        parts.append(f"refdec with memory {_speedup(row, 'refdec-memory'):.2f}x "
                     f"({row['refdec-memory']['accepted_by_source'].get('memory', 0)} tokens from memory)")
    if "refdec-hf" in row:
        parts.append(f"refdec on transformers {_speedup(row, 'refdec-hf'):.2f}x")
    for method in ("refdec-loaded", "refdec-loaded-fixed"):
        if method in row:
            parts.append(f"{method} {_speedup(row, method):.2f}x")
    if "tokens_per_pass" in row["refdec"]:
        parts.append(f"{row['refdec']['tokens_per_pass']:.2f} tokens/pass")
    return ", ".join(parts)


def markdown(records: list[dict]) -> str:
    lines = ["| workload | prompts | plain tok/s (median) | lookup / plain (median, min) | refdec / plain (median, "
             "min) | refdec / plain after the prefill (median, min) | refdec / lookup (median) | refdec tokens/pass "
             "| refdec wasted rows a pass (drafted, not accepted) | refdec prefill / decode s (sums) "
             "| identical to plain: lookup, refdec | plain's output: changed / copied the file / no whole file "
             "| refdec on transformers / plain (median) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for workload in WORKLOADS:
        rows = [r for r in records if r["workload"] == workload]
        if not rows:
            continue
        plain = [_rate(r["plain"]) for r in rows]
        lookup = [_speedup(r, "lookup") for r in rows]
        ours = [_speedup(r, "refdec") for r in rows]
        vs_lookup = [_speedup(r, "refdec") / _speedup(r, "lookup") for r in rows]
        decode = [_decode_rate(r["refdec"]) / _decode_rate(r["plain"]) for r in rows
                  if _decode_rate(r["plain"]) > 0] or [0.0]
        tpp = [r["refdec"]["tokens_per_pass"] for r in rows]
        hf_rows = [_speedup(r, "refdec-hf") for r in rows if "refdec-hf" in r]
        hf_cell = f"{statistics.median(hf_rows):.2f}x" if hf_rows else "-"
        wasted = sum(r["refdec"].get("drafted", 0) - r["refdec"].get("accepted", 0) for r in rows) / max(
            1, sum(r["refdec"]["passes"] for r in rows))
        prefill = sum(r["refdec"]["prefill_seconds"] for r in rows)
        decode_s = sum(r["refdec"]["seconds"] - r["refdec"]["prefill_seconds"] for r in rows)
        same_l = sum(r["lookup"]["agree"]["identical"] for r in rows)
        same_r = sum(r["refdec"]["agree"]["identical"] for r in rows)
        lines.append(f"| {workload} | {len(rows)} | {statistics.median(plain):.1f} | {statistics.median(lookup):.2f}x, "
                     f"{min(lookup):.2f}x | {statistics.median(ours):.2f}x, {min(ours):.2f}x | "
                     f"{statistics.median(decode):.2f}x, {min(decode):.2f}x | "
                     f"{statistics.median(vs_lookup):.2f}x | {statistics.median(tpp):.2f} | {wasted:.1f} | "
                     f"{prefill:.0f} / {decode_s:.0f} | "
                     f"{same_l}/{len(rows)}, {same_r}/{len(rows)} | {_edits(rows)} | {hf_cell} |")
    return "\n".join(lines)


def _edits(rows: list[dict]) -> str:
    kinds = [r["plain"].get("edit") for r in rows]
    if not any(kinds):
        return "-"
    return f"{kinds.count('changed')} / {kinds.count('copied')} / {kinds.count('cut')}"
