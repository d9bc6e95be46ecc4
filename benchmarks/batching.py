"""Batched end-to-end runs on transformers (``e2e.py --batch``): refdec.generate on a batch
against ``model.generate``'s batched greedy, every row compared with ``model.generate`` on that
row alone.

The prompts alternate between the run's workloads (default: edits, the original file as the
row's reference, and MT-Bench first turns; prompts over ``--max-prompt-tokens`` skipped). For
each batch size B of ``--batch`` the first B prompts are run

    hf       model.generate(left-padded ids, attention_mask, do_sample=False)
    refdec   refdec.generate(list of prompts, references per row), once per refdec method

Methods: ``refdec-N`` (N draft nodes per row and step), ``refdec-auto`` (the rows' prefixes
chosen together, priced as one padded batched forward) or ``refdec-auto-rowwise`` (each row
priced alone on the single-row curve: ``decoder.joint_batch_budget = False``). ``--heads lazy
full`` runs each with the lazy LM head (the default on a CPU: the head only on the tree rows the
acceptance walks visit, one GEMM per round for all rows) and with the head on every row
(``decoder.backend.lazy_head = False``); ``--repeats`` keeps each timing's minimum (a noisy
machine). Batched HF greedy with left padding is not bit-identical to unbatched greedy in float32
(other matmul shapes, padded keys in the softmax sums), so near-ties may flip either way; refdec's
rows are also computed batched, so both are compared with the single-row output and the count
of equal rows is reported for each.

``--continuous N``: N prompts served B at a time for each B: HF batched greedy and refdec on
consecutive static groups of B (each group waits for its slowest row), and refdec with
``max_batch_size=B`` in one call (continuous batching: a waiting prompt joins as soon as a row
finishes); total tokens / total seconds of each (the fastest of ``--repeats``), rows compared
with single-row HF; refdec with the first of ``--heads``.
"""

from __future__ import annotations

import time

from benchmarks.methods import draft_budget, first_difference
from benchmarks.report import markdown_table


def batch_methods(methods: list[str]) -> list:
    """The refdec methods of a batched run as (name, max_draft_tokens, joint pricing); ValueError
    for a method batched runs do not take (hf-greedy, the reference, is always run)."""
    out = []
    for method in methods:
        if method == "hf-greedy":
            continue
        if method not in ("refdec-auto", "refdec-auto-rowwise") and not method.removeprefix("refdec-").isdigit():
            raise ValueError(f"batched runs take refdec-auto, refdec-auto-rowwise and refdec-N, not {method!r}")
        out.append((method, draft_budget(method), method != "refdec-auto-rowwise"))
    return out


def mixed_rows(workloads: list, count: int, max_prompt_tokens: int) -> list[dict]:
    """``count`` prompts taken from the workloads in turn (the first from the first), each no longer
    than ``max_prompt_tokens``: [{"workload", "name", "prompt", "references"}]."""
    queues = [[c for c in wl.cases if len(c.prompt) <= max_prompt_tokens] for wl in workloads]
    rows = []
    while len(rows) < count and any(queues):
        for wl, queue in zip(workloads, queues):
            if queue and len(rows) < count:
                case = queue.pop(0)
                rows.append(dict(workload=wl.name, name=case.name, prompt=case.prompt.tolist(),
                                 references=[r.tolist() for r in case.references] or None))
    return rows


class BatchRunner:
    """HF batched greedy and refdec on lists of rows: (new tokens per row, seconds, ...)."""

    def __init__(self, model, tokenizer, max_new_tokens: int, repeats: int = 1) -> None:
        self.model = model
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.max_new_tokens = max_new_tokens
        self.repeats = max(1, repeats)

    def hf(self, rows: list[dict]):
        import torch

        width = max(len(r["prompt"]) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, r in enumerate(rows):
            ids[b, width - len(r["prompt"]):] = torch.tensor(r["prompt"])
            mask[b, width - len(r["prompt"]):] = 1
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=self.max_new_tokens,
                                      pad_token_id=self.pad)
        dt = time.perf_counter() - t0
        return [self._new_tokens(out[b].tolist(), width) for b in range(len(rows))], dt

    def _new_tokens(self, seq: list[int], prompt_width: int) -> list[int]:
        tail = seq[prompt_width:]
        while tail and tail[-1] == self.pad:
            tail.pop()
        return tail

    def refdec(self, rows: list[dict], lazy_head: bool, max_draft, joint: bool = True, max_batch_size=None):
        import refdec

        prompts = [r["prompt"] for r in rows]
        refs = [r["references"] for r in rows]
        t0 = time.perf_counter()
        decoder = refdec.SpeculativeDecoder(self.model)
        decoder.backend.lazy_head = lazy_head and decoder.backend.lazy_head
        decoder.joint_batch_budget = joint
        if len(rows) == 1 and max_batch_size is None:
            res = decoder.generate(prompts[0], references=refs[0], max_new_tokens=self.max_new_tokens,
                                   max_draft_tokens=max_draft)
            dt = time.perf_counter() - t0
            return [res.sequences[0].tolist()[len(prompts[0]):]], dt, res.stats, [res.stats]
        res = decoder.generate(prompts, references=refs, max_new_tokens=self.max_new_tokens,
                               max_draft_tokens=max_draft, pad_token_id=self.pad, max_batch_size=max_batch_size)
        dt = time.perf_counter() - t0
        width = res.sequences.shape[1] - max(s.new_tokens for s in res.stats.rows)
        out = [res.sequences[b].tolist()[width: width + res.stats.rows[b].new_tokens] for b in range(len(rows))]
        return out, dt, res.stats, res.stats.rows

    def fastest(self, run):
        """The run with the least time of ``repeats`` (outputs are identical across repeats)."""
        return min((run() for _ in range(self.repeats)), key=lambda r: r[1])


def single_row_reference(runner: BatchRunner, rows: list[dict]):
    """Each row's HF greedy output on its own, and the seconds all of them took."""
    single, seconds = [], 0.0
    for r in rows:
        out, dt = runner.hf([r])
        single.append(out[0])
        seconds += dt
    return single, seconds


def static(runner: BatchRunner, rows: list[dict], batch_sizes: list[int], methods: list, heads: list[str]):
    """Static batches: (results, markdown table, single-row HF tokens/s)."""
    single, single_time = single_row_reference(runner, rows)
    results = []
    for bs in batch_sizes:
        batch_rows = rows[:bs]
        hf_out, hf_dt = runner.fastest(lambda: runner.hf(batch_rows))
        hf_tokens = sum(len(x) for x in hf_out)
        for head, (method, max_draft, joint) in [(h, m) for m in methods for h in heads]:
            rd_out, rd_dt, stats, row_stats = runner.fastest(
                lambda: runner.refdec(batch_rows, head == "lazy", max_draft, joint))
            rd_tokens = sum(len(x) for x in rd_out)
            seq_single_tps = sum(len(single[b]) for b in range(bs)) / max(1e-9, single_time * bs / len(rows))
            entry = dict(
                batch_size=bs, head=head, method=method,
                hf_tokens=hf_tokens, hf_seconds=hf_dt, hf_tps=hf_tokens / hf_dt,
                refdec_tokens=rd_tokens, refdec_seconds=rd_dt, refdec_tps=rd_tokens / rd_dt,
                speedup=(rd_tokens / rd_dt) / (hf_tokens / hf_dt),
                forward_passes=stats.forward_passes,
                head_rows=stats.head_rows,
                tokens_per_pass=[round(s.tokens_per_pass, 2) for s in row_stats],
                refdec_equal_single=sum(rd_out[b] == single[b] for b in range(bs)),
                hf_batched_equal_single=sum(hf_out[b] == single[b] for b in range(bs)),
                refdec_first_mismatch=[_mismatch(rd_out[b], single[b]) for b in range(bs)],
                hf_batched_first_mismatch=[_mismatch(hf_out[b], single[b]) for b in range(bs)],
                workloads=[r["workload"] for r in batch_rows],
                forward_seconds=stats.forward_seconds,
                bookkeeping_seconds=stats.bookkeeping_seconds,
                prefill_seconds=stats.prefill_seconds,
                hf_single_sequential_tps_estimate=seq_single_tps,
            )
            results.append(entry)
            print(entry, flush=True)
    table = markdown_table(
        [[e["batch_size"], e["method"], e["head"], f"{e['hf_tps']:.1f}", f"{e['refdec_tps']:.1f}",
          f"{e['speedup']:.2f}x", e["forward_passes"], e["head_rows"], f"{e['forward_seconds']:.2f}",
          f"{e['refdec_equal_single']}/{e['batch_size']}",
          f"{e['hf_batched_equal_single']}/{e['batch_size']}"] for e in results],
        ["B", "method", "head", "HF tok/s", "refdec tok/s", "ratio", "refdec passes", "head rows", "forward s",
         "refdec rows = single HF", "HF batched rows = single HF"])
    single_tps = sum(len(s) for s in single) / single_time
    table += f"\n\nHF single-row sequential: {single_tps:.1f} tok/s over {len(rows)} prompts"
    return results, table, single_tps


def _mismatch(tokens: list, reference: list) -> int:
    """The first differing position, -1 when identical."""
    first = first_difference(tokens, reference)
    return -1 if first is None else first


def continuous(runner: BatchRunner, rows: list[dict], batch_sizes: list[int], methods: list, head: str):
    """The rows served B at a time, static groups against continuous batching: (results, table)."""
    single, _ = single_row_reference(runner, rows)
    n = len(rows)
    results = []
    for bs in batch_sizes:
        groups = [list(range(g, min(g + bs, n))) for g in range(0, n, bs)]
        for method, max_draft, joint in methods:
            runs = {}
            # alternate the order per batch size (a noisy machine drifts)
            order = ["hf-static", "refdec-static", "refdec-continuous"]
            for way in order if bs % 2 == 0 else order[::-1]:
                outs, seconds = runner.fastest(lambda: _serve(runner, way, rows, groups, head == "lazy", max_draft,
                                                              joint, bs))
                tokens = sum(len(o) for o in outs)
                runs[way] = dict(seconds=seconds, tokens=tokens, tps=tokens / seconds,
                                 equal_single=sum(outs[b] == single[b] for b in range(n)))
            entry = dict(prompts=n, batch_size=bs, method=method, head=head, **{
                f"{m}_{k}": v for m, r in runs.items() for k, v in r.items()})
            entry["continuous_vs_static"] = runs["refdec-continuous"]["tps"] / runs["refdec-static"]["tps"]
            entry["continuous_vs_hf_static"] = runs["refdec-continuous"]["tps"] / runs["hf-static"]["tps"]
            results.append(entry)
            print(entry, flush=True)
    table = markdown_table(
        [[e["prompts"], e["batch_size"], e["method"], f"{e['hf-static_tps']:.1f}", f"{e['refdec-static_tps']:.1f}",
          f"{e['refdec-continuous_tps']:.1f}", f"{e['continuous_vs_static']:.2f}x",
          f"{e['continuous_vs_hf_static']:.2f}x", f"{e['refdec-static_equal_single']}/{n}",
          f"{e['refdec-continuous_equal_single']}/{n}", f"{e['hf-static_equal_single']}/{n}"] for e in results],
        ["prompts", "B", "method", "HF static tok/s", "refdec static tok/s", "refdec continuous tok/s",
         "continuous / static", "continuous / HF static", "refdec static rows = single HF",
         "refdec continuous rows = single HF", "HF batched rows = single HF"])
    return results, table


def _serve(runner: BatchRunner, way: str, rows: list[dict], groups: list, lazy_head: bool, max_draft, joint: bool,
           batch_size: int):
    """(outputs, seconds) of serving ``rows``: static ``groups`` (hf-static, refdec-static), or one
    continuous-batching call of ``batch_size`` rows at a time (refdec-continuous)."""
    if way == "refdec-continuous":
        outs, seconds, _, _ = runner.refdec(rows, lazy_head, max_draft, joint, max_batch_size=batch_size)
        return outs, seconds
    outs, seconds = [None] * len(rows), 0.0
    for g in groups:
        group = [rows[b] for b in g]
        out, dt = runner.hf(group) if way == "hf-static" else runner.refdec(group, lazy_head, max_draft, joint)[:2]
        seconds += dt
        for b, o in zip(g, out):
            outs[b] = o
    return outs, seconds
