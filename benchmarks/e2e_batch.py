"""Batched end-to-end speed: refdec.generate on a batch vs model.generate batched greedy.

The default model (Gemma 3 270M, float32, 2 threads), a mix of edit prompts
(shared/data/edits-click.jsonl, the original file as the row's reference) and
chat prompts (mtbench first turns), alternating, 64 new tokens. For each batch
size B the first B prompts of the mix are run

    hf       model.generate(left-padded ids, attention_mask, do_sample=False)
    refdec   refdec.generate(list of prompts, references per row)

and every row is compared with model.generate on that row alone. ``--heads lazy full``
runs refdec twice per batch size, with the lazy LM head (the default on a CPU: the head
only on the tree rows the acceptance walks visit, one GEMM per round for all rows) and
with the head on every row (``decoder.backend.lazy_head = False``), so the two are compared in
the same run; ``--repeats`` keeps each timing's minimum (a noisy machine). Batched HF
greedy with left padding is not bit-identical to unbatched greedy in float32
(other matmul shapes, padded keys in the softmax sums), so near-ties may flip
either way; refdec's rows are also computed batched, so both are compared with
the single-row output and the count of equal rows is reported for each.

    python -m benchmarks.e2e_batch [--batch-sizes 1 4 8] [--new 64] [--max-draft 8 [auto ...]]
        [--heads lazy full] [--repeats 1] [--continuous N]

``--continuous N``: N prompts of the same mix, served B at a time for each B of
``--batch-sizes``: HF batched greedy and refdec on consecutive static groups of B
(each group waits for its slowest row), and refdec with ``max_batch_size=B`` in one call
(continuous batching: a waiting prompt joins as soon as a row finishes); total tokens /
total seconds of each (the fastest of ``--repeats``), rows compared with single-row HF;
refdec with the first of ``--heads``.

``--max-draft`` takes several values, run side by side per batch size: a node count, ``auto``
(the rows' prefixes chosen together, priced as one padded batched forward) or
``auto-rowwise`` (each row priced alone on the single-row curve, the earlier policy).

Writes benchmarks/out/e2e_batch.json. The current figures, with their commands:
benchmarks/RESULTS.md (section 5); earlier ones: CHANGELOG.md ("Benchmark history").
"""

from __future__ import annotations

import argparse
import time

import torch

import refdec
from benchmarks import data, report, tokens, workloads
from benchmarks.report import markdown_table


def mixed_prompts(count: int, max_edit_tokens: int) -> list[dict]:
    edits = [c for c in workloads.load_edits().cases if len(c.prompt) <= max_edit_tokens][: (count + 1) // 2]
    chats = [tokens.encode(workloads.chat_prompt(q), bos=True)
             for q in data.chat_questions("mtbench", limit=count // 2)]
    rows = []
    for i in range(count):
        if i % 2 == 0 and edits:
            c = edits.pop(0)
            rows.append(dict(kind="edit", name=c.name, prompt=c.prompt.tolist(),
                             references=[r.tolist() for r in c.references]))
        elif chats:
            rows.append(dict(kind="chat", name=f"mtbench/{i}", prompt=chats.pop(0).tolist(), references=None))
    return rows


def new_tokens(seq: list[int], prompt_width: int, pad: int) -> list[int]:
    tail = seq[prompt_width:]
    while tail and tail[-1] == pad:
        tail.pop()
    return tail


def first_mismatch(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--max-draft", nargs="+", default=["8"],
                    help="draft nodes per row and step, 'auto' (rows priced together as one batched "
                         "forward), or 'auto-rowwise' (each row priced alone: decoder.joint_batch_budget "
                         "= False); several values are run side by side")
    ap.add_argument("--max-edit-tokens", type=int, default=700, help="skip longer edit prompts (keeps it small)")
    ap.add_argument("--heads", nargs="+", choices=["lazy", "full"], default=["lazy", "full"],
                    help="refdec's LM head: lazy (visited rows only) and/or full (every tree row)")
    ap.add_argument("--repeats", type=int, default=1, help="time each run this many times, keep the minimum")
    ap.add_argument("--continuous", type=int, default=0, metavar="N",
                    help="N prompts served B at a time: static groups vs max_batch_size=B (continuous batching)")
    args = ap.parse_args(argv)
    if args.continuous < 0:
        ap.error(f"--continuous takes a number of prompts >= 1, got {args.continuous}")
    for m in args.max_draft:
        if m not in ("auto", "auto-rowwise") and not (m.isdigit()):
            ap.error(f"--max-draft values are ints >= 0, 'auto' or 'auto-rowwise', got {m!r}")
    drafts = [m if m in ("auto", "auto-rowwise") else int(m) for m in args.max_draft]
    torch.set_num_threads(2)

    from refdec.models import load_default

    model, tok = load_default()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    rows = mixed_prompts(max(args.continuous, *args.batch_sizes), args.max_edit_tokens)
    print(f"{len(rows)} prompts, lengths {[len(r['prompt']) for r in rows]}", flush=True)

    def hf_batch(batch_rows):
        width = max(len(r["prompt"]) for r in batch_rows)
        ids = torch.full((len(batch_rows), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, r in enumerate(batch_rows):
            ids[b, width - len(r["prompt"]):] = torch.tensor(r["prompt"])
            mask[b, width - len(r["prompt"]):] = 1
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=args.new,
                                 pad_token_id=pad)
        dt = time.perf_counter() - t0
        return [new_tokens(out[b].tolist(), width, pad) for b in range(len(batch_rows))], dt

    # warm-up (threads, allocator), then the single-row HF reference of every prompt
    hf_batch(rows[:1])
    single, single_time = [], 0.0
    for r in rows:
        out, dt = hf_batch([r])
        single.append(out[0])
        single_time += dt

    def refdec_batch(batch_rows, lazy_head: bool, max_draft, max_batch_size=None):
        prompts = [r["prompt"] for r in batch_rows]
        refs = [r["references"] for r in batch_rows]
        t0 = time.perf_counter()
        decoder = refdec.SpeculativeDecoder(model)
        decoder.backend.lazy_head = lazy_head and decoder.backend.lazy_head
        decoder.joint_batch_budget = max_draft != "auto-rowwise"
        max_draft = "auto" if max_draft == "auto-rowwise" else max_draft
        if len(batch_rows) == 1 and max_batch_size is None:
            res = decoder.generate(prompts[0], references=refs[0], max_new_tokens=args.new,
                                   max_draft_tokens=max_draft)
            dt = time.perf_counter() - t0
            return [res.sequences[0].tolist()[len(prompts[0]):]], dt, res.stats, [res.stats]
        res = decoder.generate(prompts, references=refs, max_new_tokens=args.new, max_draft_tokens=max_draft,
                               pad_token_id=pad, max_batch_size=max_batch_size)
        dt = time.perf_counter() - t0
        width = res.sequences.shape[1] - max(s.new_tokens for s in res.stats.rows)
        rd_out = [res.sequences[b].tolist()[width: width + res.stats.rows[b].new_tokens]
                  for b in range(len(batch_rows))]
        return rd_out, dt, res.stats, res.stats.rows

    def fastest(run):
        """The run with the least time of ``--repeats`` (outputs are identical across repeats)."""
        return min((run() for _ in range(max(1, args.repeats))), key=lambda r: r[1])

    if args.continuous:
        continuous(args, rows, single, drafts, hf_batch, refdec_batch, argv)
        return
    results = []
    for bs in args.batch_sizes:
        batch_rows = rows[:bs]
        hf_out, hf_dt = fastest(lambda: hf_batch(batch_rows))
        hf_tokens = sum(len(x) for x in hf_out)
        for head, max_draft in [(h, m) for m in drafts for h in args.heads]:
            rd_out, rd_dt, stats, row_stats = fastest(lambda: refdec_batch(batch_rows, head == "lazy", max_draft))
            rd_tokens = sum(len(x) for x in rd_out)
            seq_single_tps = sum(len(single[b]) for b in range(bs)) / max(1e-9, single_time * bs / len(rows))
            entry = dict(
                batch_size=bs, head=head, max_draft=max_draft,
                hf_tokens=hf_tokens, hf_seconds=hf_dt, hf_tps=hf_tokens / hf_dt,
                refdec_tokens=rd_tokens, refdec_seconds=rd_dt, refdec_tps=rd_tokens / rd_dt,
                speedup=(rd_tokens / rd_dt) / (hf_tokens / hf_dt),
                forward_passes=stats.forward_passes,
                head_rows=stats.head_rows,
                tokens_per_pass=[round(s.tokens_per_pass, 2) for s in row_stats],
                refdec_equal_single=sum(rd_out[b] == single[b] for b in range(bs)),
                hf_batched_equal_single=sum(hf_out[b] == single[b] for b in range(bs)),
                refdec_first_mismatch=[first_mismatch(rd_out[b], single[b]) for b in range(bs)],
                hf_batched_first_mismatch=[first_mismatch(hf_out[b], single[b]) for b in range(bs)],
                kinds=[r["kind"] for r in batch_rows],
                forward_seconds=stats.forward_seconds,
                bookkeeping_seconds=stats.bookkeeping_seconds,
                prefill_seconds=stats.prefill_seconds,
                hf_single_sequential_tps_estimate=seq_single_tps,
            )
            results.append(entry)
            print(entry, flush=True)
    table = markdown_table(
        [[e["batch_size"], e["max_draft"], e["head"], f"{e['hf_tps']:.1f}", f"{e['refdec_tps']:.1f}", f"{e['speedup']:.2f}x",
          e["forward_passes"], e["head_rows"], f"{e['forward_seconds']:.2f}",
          f"{e['refdec_equal_single']}/{e['batch_size']}",
          f"{e['hf_batched_equal_single']}/{e['batch_size']}"] for e in results],
        ["B", "draft", "head", "HF tok/s", "refdec tok/s", "ratio", "refdec passes", "head rows", "forward s",
         "refdec rows = single HF", "HF batched rows = single HF"])
    print(table)
    print(f"HF single-row sequential: {sum(len(s) for s in single) / single_time:.1f} tok/s over {len(rows)} prompts")
    path = report.write_result(report.result_path(None, "e2e_batch", timestamp=False), dict(args=vars(args), rows=[
        dict(kind=r["kind"], name=r["name"], prompt_len=len(r["prompt"])) for r in rows],
        single_hf_tps=sum(len(s) for s in single) / single_time, results=results, table=table), argv=argv)
    print(f"wrote {path}")


def continuous(args, rows, single, drafts, hf_batch, refdec_batch, argv=None) -> None:
    """``--continuous N``: the N prompts served B at a time, static groups vs continuous batching."""
    rows, single = rows[: args.continuous], single[: args.continuous]
    n = len(rows)
    head = args.heads[0] == "lazy"
    results = []
    for bs in args.batch_sizes:
        groups = [list(range(g, min(g + bs, n))) for g in range(0, n, bs)]
        for max_draft in drafts:
            runs = {}
            # alternate the order per batch size (a noisy machine drifts)
            order = ["hf-static", "refdec-static", "refdec-continuous"]
            for method in order if bs % 2 == 0 else order[::-1]:
                best = None
                for _ in range(max(1, args.repeats)):  # keep the fastest of --repeats (same outputs)
                    outs, seconds = [None] * n, 0.0
                    if method == "refdec-continuous":
                        outs, seconds, _, _ = refdec_batch(rows, head, max_draft, max_batch_size=bs)
                    else:
                        for g in groups:
                            if method == "hf-static":
                                out, dt = hf_batch([rows[b] for b in g])
                            else:
                                out, dt, _, _ = refdec_batch([rows[b] for b in g], head, max_draft)
                            seconds += dt
                            for b, o in zip(g, out):
                                outs[b] = o
                    if best is None or seconds < best[1]:
                        best = (outs, seconds)
                outs, seconds = best
                tokens = sum(len(o) for o in outs)
                runs[method] = dict(seconds=seconds, tokens=tokens, tps=tokens / seconds,
                                    equal_single=sum(outs[b] == single[b] for b in range(n)))
            entry = dict(prompts=n, batch_size=bs, max_draft=max_draft, head=args.heads[0], **{
                f"{m}_{k}": v for m, r in runs.items() for k, v in r.items()})
            entry["continuous_vs_static"] = runs["refdec-continuous"]["tps"] / runs["refdec-static"]["tps"]
            entry["continuous_vs_hf_static"] = runs["refdec-continuous"]["tps"] / runs["hf-static"]["tps"]
            results.append(entry)
            print(entry, flush=True)
    table = markdown_table(
        [[e["prompts"], e["batch_size"], e["max_draft"], f"{e['hf-static_tps']:.1f}", f"{e['refdec-static_tps']:.1f}",
          f"{e['refdec-continuous_tps']:.1f}", f"{e['continuous_vs_static']:.2f}x", f"{e['continuous_vs_hf_static']:.2f}x",
          f"{e['refdec-static_equal_single']}/{n}", f"{e['refdec-continuous_equal_single']}/{n}",
          f"{e['hf-static_equal_single']}/{n}"] for e in results],
        ["prompts", "B", "draft", "HF static tok/s", "refdec static tok/s", "refdec continuous tok/s",
         "continuous / static", "continuous / HF static", "refdec static rows = single HF",
         "refdec continuous rows = single HF", "HF batched rows = single HF"])
    print(table)
    path = report.write_result(report.result_path(None, "e2e_batch-continuous", timestamp=False), dict(
        args=vars(args), rows=[dict(kind=r["kind"], name=r["name"], prompt_len=len(r["prompt"])) for r in rows],
        results=results, table=table), argv=argv)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
