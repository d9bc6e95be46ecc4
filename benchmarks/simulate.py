"""Model-free drafting simulator: how many tokens per verification step would a
drafter reach if the target model always produced a known output?

For each (prompt, true output) pair the drafter is replayed step by step:

    1. it proposes a tree (or chain) of at most ``budget`` nodes;
    2. accepted = the longest root path of the tree that matches the true
       continuation, plus one bonus token (the target's own next token), so a
       step always advances by >= 1 token (never past the end of the output);
    3. the drafter is told the advanced tokens (``accept``).

tokens/step = output tokens / steps, pooled over the cases of a workload.
Proposal latency = the time of propose + accept per step (p50 / p99, µs).

    python -m benchmarks.simulate --workloads edits,humaneval,summarization,rag \\
        --budgets 8,16,32,64 [--methods refdec,prompt-lookup,oracle-chain] [--limit N] [--json OUT]

Methods:
    refdec          refdec.Proposer (live context + per-request references + the
                    workload's corpus index, if any)
    refdec-nocorpus the same without the corpus index (workloads with a corpus)
    refdec:KEY=INT[:KEY=INT]  refdec with Proposer keyword arguments, e.g.
                    refdec:backoff=1:min_backoff_len=2
    prompt-lookup   last earlier occurrence of the trailing 3-, else 2-, else
                    1-gram; one chain of k = budget tokens (DESIGN.md's rule)
    hf-prompt-lookup transformers' prompt_lookup_num_tokens exactly: 2..1-grams,
                    the first (leftmost) occurrence
    oracle-chain    longest k-capped run of the true continuation found verbatim
                    in prompt + output so far (bound for any copied chain)
    oracle-suffix1  the same, but copied only from places preceded by the
                    context's last token: the bound for suffix-match drafting
                    (match >= 1) with unlimited width
    arctic          ArcticInference SuffixDecodingCache (if importable)
    draftretriever  the PyPI ``draftretriever`` 0.1.1 over the workload's corpus
                    (if importable; workloads with a corpus). NB: not REST's
                    suffix array: a bigram -> top-12 next-token table searched by
                    MCTS, which adds each query's 3-grams to the table (it learns
                    from the context); a fresh Reader per case
    draftretriever-shared  the same with one Reader per pass (learns across cases)

Diagnostics (each prints a table and exits):
    --diagnose edits:32    refdec's losing steps against the oracle chain, by kind
    --ceiling edits:64     refdec/oracle hybrids: which steps hold the gap to the oracle
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from benchmarks import baselines, corpora, data, report, tokens, workloads

DEFAULT_METHODS = ("refdec", "refdec-nocorpus", "prompt-lookup", "hf-prompt-lookup", "oracle-chain",
                   "oracle-suffix1", "arctic", "draftretriever", "draftretriever-shared")


# ---------------------------------------------------------------- accounting

def accepted_path(tree, truth: list, pos: int) -> tuple:
    """(length, node_idx) of the longest root path of ``tree`` whose tokens
    equal ``truth[pos:]`` (``truth`` a list of ints); node_idx = -1 when none.
    Parents precede children, so one forward pass suffices."""
    n = len(tree)
    remaining = len(truth) - pos
    if n == 0 or remaining <= 0:
        return 0, -1
    tokens = tree.token_ids.tolist()
    parents = tree.parents.tolist()
    depths = tree.depths.tolist()
    on_path = [False] * n
    best, best_node = 0, -1
    for node_idx in range(n):
        parent = parents[node_idx]
        d = depths[node_idx]
        parent_ok = parent < 0 or on_path[parent]
        if parent_ok and d <= remaining and tokens[node_idx] == truth[pos + d - 1]:
            on_path[node_idx] = True
            if d > best:
                best, best_node = d, node_idx
    return best, best_node


def accepted_length(tree, truth: list, pos: int) -> int:
    """Length of the longest root path of ``tree`` matching ``truth[pos:]``."""
    return accepted_path(tree, truth, pos)[0]


def _count_sources(tree, node_idx: int, counts: dict) -> None:
    """Adds the accepted path ending at ``node_idx`` to ``counts`` by source name."""
    names = tree.source_names
    while node_idx >= 0:
        sid = int(tree.source_ids[node_idx])
        name = names[sid] if 0 <= sid < len(names) else str(sid)
        counts[name] = counts.get(name, 0) + 1
        node_idx = int(tree.parents[node_idx])


@dataclass
class Replay:
    """The replay of one drafter on one case.

    accepted   int list [steps]: draft tokens accepted per step (bonus excluded)
    advanced   int list [steps]: output tokens emitted per step (>= 1)
    nodes      int list [steps]: tree size proposed per step
    latency_ns int list [steps]: propose + accept time per step
    by_source  accepted draft tokens per source name (DraftTree.source_names)
    """

    output_tokens: int
    accepted: list = field(default_factory=list)
    advanced: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    latency_ns: list = field(default_factory=list)
    by_source: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.advanced)


def replay(proposer, prompt, output, budget: int) -> Replay:
    """Replay ``proposer`` (start / propose / accept) over one (prompt, output)."""
    truth = np.asarray(output, dtype=np.int32)
    truth_list = truth.tolist()
    m = len(truth_list)
    rec = Replay(output_tokens=m)
    t0 = time.perf_counter_ns()
    proposer.start(np.asarray(prompt, dtype=np.int32))
    rec.start_ns = time.perf_counter_ns() - t0
    pos = 0
    while pos < m:
        t0 = time.perf_counter_ns()
        tree = proposer.propose(budget)
        t1 = time.perf_counter_ns()
        if len(tree) > budget:
            raise ValueError(f"{type(proposer).__name__} proposed {len(tree)} nodes over the budget {budget}")
        acc, node = accepted_path(tree, truth_list, pos)
        if node >= 0:
            _count_sources(tree, node, rec.by_source)
        adv = min(acc + 1, m - pos)
        t2 = time.perf_counter_ns()
        proposer.accept(truth[pos:pos + adv])
        t3 = time.perf_counter_ns()
        rec.accepted.append(acc)
        rec.advanced.append(adv)
        rec.nodes.append(len(tree))
        rec.latency_ns.append((t1 - t0) + (t3 - t2))
        pos += adv
    return rec


def summarize(replays: list) -> dict:
    tokens = sum(r.output_tokens for r in replays)
    steps = sum(r.steps for r in replays)
    lat = np.concatenate([np.asarray(r.latency_ns, dtype=np.int64) for r in replays]) if replays else np.zeros(0)
    nodes = np.concatenate([np.asarray(r.nodes) for r in replays]) if replays else np.zeros(0)
    by_source = {}
    for r in replays:
        for k, v in r.by_source.items():
            by_source[k] = by_source.get(k, 0) + v
    return {
        "accepted_by_source": by_source,
        "cases": len(replays),
        "output_tokens": tokens,
        "steps": steps,
        "tokens_per_step": tokens / steps if steps else float("nan"),
        "mean_nodes": float(nodes.mean()) if nodes.size else 0.0,
        "latency_us_p50": float(np.percentile(lat, 50)) / 1e3 if lat.size else 0.0,
        "latency_us_p99": float(np.percentile(lat, 99)) / 1e3 if lat.size else 0.0,
        "start_ms_mean": float(np.mean([getattr(r, "start_ns", 0) for r in replays])) / 1e6 if replays else 0.0,
    }


# ---------------------------------------------------------------- methods

def refdec_available() -> bool:
    try:
        import refdec

        return hasattr(refdec, "Proposer")
    except Exception:
        return False


def method_factory(name: str, workload, corpus=None, max_depth: int = 64):
    """A function case -> a fresh drafter for that case, or None if unavailable."""
    if name == "prompt-lookup":
        return lambda case: baselines.PromptLookup(max_ngram=3, occurrence="last")
    if name == "hf-prompt-lookup":
        return lambda case: baselines.PromptLookup(max_ngram=2, occurrence="first")
    if name == "oracle-chain":
        return lambda case: baselines.OracleChain(case.output)
    if name == "oracle-suffix1":
        return lambda case: baselines.OracleChain(case.output, anchor=1)
    base, *opts = name.split(":")
    if base in ("refdec", "refdec-nocorpus"):
        if not refdec_available() or (base == "refdec-nocorpus" and workload.corpus is None):
            return None  # refdec-nocorpus only where the workload has a corpus
        import refdec

        # "refdec:backoff=1:loop_decay=0.7": numeric keyword arguments of Proposer
        kwargs = {"max_depth": max_depth}
        for opt in opts:
            key, _, value = opt.partition("=")
            kwargs[key] = int(value) if value.lstrip("-").isdigit() else float(value)
        index = corpus if base == "refdec" else None
        return lambda case: refdec.Proposer(index=index, references=list(case.references) or None, **kwargs)
    if name == "arctic":
        if not baselines.arctic_available():
            return None
        # Arctic's per-request tree covers prompt + output; references of the
        # edits workload are inside the prompt already. No global corpus.
        return lambda case: baselines.ArcticSuffix()
    if name in ("draftretriever", "draftretriever-shared"):
        if workload.corpus is None or not baselines.draftretriever_available():
            return None
        # Its Reader learns: every search adds the query's 3-grams to the table.
        # "draftretriever" loads a fresh Reader per case (per-request state, as
        # refdec); "draftretriever-shared" one Reader per (workload, budget)
        # pass, learning across the cases in order. Never one Reader across
        # budgets: the second pass would have learned the true outputs.
        if name == "draftretriever":
            return lambda case: baselines.DraftRetrieverProposer(corpora.draftretriever_reader(workload.corpus))
        reader = corpora.draftretriever_reader(workload.corpus)
        return lambda case: baselines.DraftRetrieverProposer(reader)
    raise ValueError(f"unknown method {name!r}; expected one of {DEFAULT_METHODS}")


def run(workload_names, methods, budgets, limit=None, progress=True) -> dict:
    results = {}
    for wname in workload_names:
        wl = workloads.load_workload(wname, limit)
        if not wl.cases:
            print(f"[{wname}] no cases (data or cached outputs missing): skipped", file=sys.stderr)
            continue
        corpus = None
        if wl.corpus and any(m.startswith("refdec") for m in methods) and refdec_available():
            t0 = time.time()
            corpus = corpora.corpus_index(wl.corpus)
            print(f"[{wname}] corpus {wl.corpus} ready in {time.time() - t0:.1f}s", file=sys.stderr)
        results[wname] = {"cases": len(wl.cases),
                          "output_tokens": int(sum(len(c.output) for c in wl.cases)),
                          "prompt_tokens": int(sum(len(c.prompt) for c in wl.cases)),
                          "corpus": wl.corpus, "methods": {}}
        for mname in methods:
            make = method_factory(mname, wl, corpus)  # availability check; one per pass below
            if make is None:
                if not (mname.startswith(("refdec-nocorpus", "draftretriever"))) or wl.corpus:
                    print(f"[{wname}] method {mname} unavailable: skipped", file=sys.stderr)
                continue
            per_budget = {}
            for budget in budgets:
                t0 = time.time()
                make = method_factory(mname, wl, corpus)  # fresh state per pass (stateful baselines)
                reps = [replay(make(case), case.prompt, case.output, budget) for case in wl.cases]
                per_budget[str(budget)] = summarize(reps)
                if progress:
                    s = per_budget[str(budget)]
                    print(f"[{wname}] {mname:>16} k={budget:<3} {s['tokens_per_step']:6.2f} tok/step  "
                          f"p50 {s['latency_us_p50']:.0f}us p99 {s['latency_us_p99']:.0f}us "
                          f"({time.time() - t0:.1f}s)", file=sys.stderr)
            results[wname]["methods"][mname] = per_budget
    return results


# ---------------------------------------------------------------- diagnostics

LOSS_KINDS = ("empty tree", "wrong first token", "wrong branch", "path ended (budget spent on other branches)",
              "path ended (tree under budget)")


def diagnose(workload_name: str, budget: int, limit=None, corpus=None, anchor: int = 0) -> dict:
    """:func:`diagnose_cases` over a workload (its corpus index unless ``corpus`` is given)."""
    wl = workloads.load_workload(workload_name, limit)
    if corpus is None and wl.corpus:
        corpus = corpora.corpus_index(wl.corpus)
    return {"workload": workload_name, **diagnose_cases(wl.cases, budget, corpus=corpus, anchor=anchor)}


def diagnose_cases(cases, budget: int, corpus=None, anchor: int = 0) -> dict:
    """Replays refdec as the decoder runs it (editing mode, i.e. the copy cursor,
    when a case has references) and, at each of its steps, the oracle chain
    from the same position: classifies the steps where refdec accepted fewer
    tokens than the oracle's copied run, and sums the tokens lost per kind.

    ``anchor`` = 1 compares against oracle-suffix1 (the reachable bound for
    suffix-match drafting) instead of the free oracle chain.

    Kinds of loss (A = refdec accepted, O = oracle run, both capped at budget):
        empty tree          refdec proposed nothing
        wrong first token   no child of the root is the true next token
        wrong branch        the accepted path's last node has children, none true
        path ended (...)    the accepted path is a leaf: the draft stopped there,
                            with the budget spent on other branches or not
    """
    import refdec

    lost = dict.fromkeys(LOSS_KINDS, 0)
    count = dict.fromkeys(LOSS_KINDS, 0)
    match_hist = {kind: [] for kind in LOSS_KINDS}
    samples = []
    peer_better, peer_worse = [0, 0], [0, 0]
    rank_hist = dict.fromkeys(RANK_BUCKETS, 0)
    root_kids = []
    total_steps = total_tokens = refdec_acc = oracle_acc = 0
    for case in cases:
        truth = np.asarray(case.output, dtype=np.int32)
        truth_list = truth.tolist()
        prop = refdec.Proposer(index=corpus, references=list(case.references) or None, max_depth=64,
                               cursor=bool(case.references))
        oracle = baselines.OracleChain(truth, anchor=anchor)
        peer = baselines.CursorLookup()
        prop.start(case.prompt)
        oracle.start(case.prompt)
        peer.start(case.prompt)
        pos = 0
        while pos < len(truth_list):
            matches = prop.last_match_lengths()
            tree = prop.propose(budget)
            o_len, o_src = oracle.match_length(budget)
            acc = accepted_length(tree, truth_list, pos)
            peer_acc = accepted_length(peer.propose(budget), truth_list, pos)
            if peer_acc > acc:
                peer_better[0] += 1
                peer_better[1] += peer_acc - acc
            elif peer_acc < acc:
                peer_worse[0] += 1
                peer_worse[1] += acc - peer_acc
            total_steps += 1
            refdec_acc += acc
            oracle_acc += o_len
            if acc < o_len:
                if len(tree) == 0:
                    kind = LOSS_KINDS[0]
                elif acc == 0:
                    kind = LOSS_KINDS[1]
                else:
                    # the deepest node on the accepted path: does it have children?
                    node = _path_end(tree, truth_list, pos, acc)
                    has_children = bool((tree.parents == node).any())
                    if has_children:
                        kind = LOSS_KINDS[2]
                    elif len(tree) >= budget:
                        kind = LOSS_KINDS[3]
                    else:
                        kind = LOSS_KINDS[4]
                if kind == LOSS_KINDS[1]:
                    rank_hist[_true_token_rank(prop, truth_list[pos])] += 1
                    root_kids.append(int((tree.parents < 0).sum()))
                lost[kind] += o_len - acc
                count[kind] += 1
                match_hist[kind].append(max(matches.values()))
                if len(samples) < 400:
                    samples.append({"case": case.name, "pos": pos, "kind": kind, "accepted": acc,
                                    "oracle": o_len, "nodes": len(tree), "matches": matches,
                                    "context_tail": np.concatenate([case.prompt, truth[:pos]])[-12:].tolist(),
                                    "truth": truth_list[pos:pos + o_len],
                                    "best_path": _best_path(tree),
                                    "oracle_src": o_src})
            adv = min(acc + 1, len(truth_list) - pos)
            prop.accept(truth[pos:pos + adv])
            oracle.accept(truth[pos:pos + adv])
            peer.accept(truth[pos:pos + adv])
            pos += adv
        total_tokens += len(truth_list)
    return {"budget": budget, "oracle": "oracle-suffix1" if anchor else "oracle-chain",
            "steps": total_steps, "tokens": total_tokens,
            "refdec_accepted": refdec_acc, "oracle_accepted_same_positions": oracle_acc,
            "lost_tokens": lost, "loss_steps": count,
            "wrong_first_token_rank": rank_hist,
            "wrong_first_token_root_children_median": float(np.median(root_kids)) if root_kids else None,
            "cursor_lookup_better": {"steps": peer_better[0], "tokens": peer_better[1]},
            "cursor_lookup_worse": {"steps": peer_worse[0], "tokens": peer_worse[1]},
            "median_max_match_len": {k: float(np.median(v)) if v else None for k, v in match_hist.items()},
            "samples": samples}


RANK_BUCKETS = ("1", "2", "3-4", "5-8", "9-16", ">16", "only after backing off to a shorter suffix", "never seen")


def _true_token_rank(prop, true_token: int) -> str:
    """Rank bucket of the true next token among the continuations of the
    context's longest matched suffix (by count, as the proposer ranks them)."""
    ctx = prop.context
    tokens = ctx.tokens()
    length = ctx.current_match_length
    nxt = [t for t, _ in ctx.next_tokens(tokens[len(tokens) - length:], 100000)] if length else []
    if true_token in nxt:
        r = nxt.index(true_token) + 1
        for bucket, hi in (("1", 1), ("2", 2), ("3-4", 4), ("5-8", 8), ("9-16", 16)):
            if r <= hi:
                return bucket
        return ">16"
    for shorter in range(length - 1, 0, -1):
        if true_token in [t for t, _ in ctx.next_tokens(tokens[len(tokens) - shorter:], 100000)]:
            return RANK_BUCKETS[6]
    return RANK_BUCKETS[7]


def _path_end(tree, truth, pos, acc) -> int:
    """Node index at depth ``acc`` on the accepted path (-1 for the root)."""
    node = -1
    tokens, parents = tree.token_ids.tolist(), tree.parents.tolist()
    for d in range(acc):
        node = next(i for i in range(len(tokens)) if parents[i] == node and tokens[i] == truth[pos + d])
    return node


def _best_path(tree) -> list:
    """Tokens of the root path to the highest-scoring deepest node (the draft's main line)."""
    if len(tree) == 0:
        return []
    depths = tree.depths
    # the main line: follow the best-scored child from the root
    tokens, parents, scores = tree.token_ids.tolist(), tree.parents.tolist(), tree.scores.tolist()
    path, node = [], -1
    while True:
        kids = [i for i in range(len(tokens)) if parents[i] == node]
        if not kids:
            return path
        node = max(kids, key=lambda i: (scores[i], depths[i]))
        path.append(tokens[node])


def _reference_offsets(reference: list, run: list, anchor: int) -> list:
    """Offsets from ``anchor`` of every occurrence of ``run`` (a token list) in ``reference``."""
    if not run or len(reference) < len(run):
        return []
    ref = np.asarray(reference)
    starts = np.flatnonzero(ref[: len(ref) - len(run) + 1] == run[0])
    return [int(q) - anchor for q in starts if reference[q:q + len(run)] == run]


CEILING_RULES = {
    "refdec alone": lambda acc, offsets: False,
    "oracle wherever it copies more": lambda acc, offsets: True,
    "... only where refdec accepts >= 4": lambda acc, offsets: acc >= 4,
    "... only where refdec accepts < 4": lambda acc, offsets: acc < 4,
    "... only where the run is in the reference at or after the anchor, <= 64 on": lambda acc, offsets: any(
        0 <= d <= 64 for d in offsets),
    "... only where the run is in the reference only behind the anchor": lambda acc, offsets: bool(offsets) and all(
        d < 0 for d in offsets),
    "... only where the run is not in the reference": lambda acc, offsets: not offsets,
}
# Hybrids with refdec's own wider tree instead of the oracle: what a perfect pick among refdec's
# present candidates would give (the tree of CEILING_WIDE_NODES nodes, accepted depth capped at the budget).
CEILING_WIDE_NODES = 2048
CEILING_WIDE_RULES = {
    f"refdec's {CEILING_WIDE_NODES}-node tree, only where refdec accepts < 4": lambda acc: acc < 4,
    f"refdec's {CEILING_WIDE_NODES}-node tree at every step": lambda acc: True,
}


# A perfect pick among the copy cursor's candidates (editing mode): at every step the longest
# copy from any of them, as one chain of the whole budget (what the best possible weighting of
# the cursor's candidates would give).
CEILING_CURSOR_RULES = {"the cursor's best candidate as a whole-budget chain, at every step": lambda acc: True}


def _longest_candidate_copy(reference: list, positions, truth: list, pos: int, budget: int) -> int:
    """Longest run of ``truth[pos:]`` (<= budget tokens) copied from ``reference`` at one of ``positions``."""
    best = 0
    for start in positions:
        run = 0
        while (run < budget and start + run < len(reference) and pos + run < len(truth)
               and reference[start + run] == truth[pos + run]):
            run += 1
        best = max(best, run)
    return best


def ceiling(workload_name: str, budget: int, limit=None, corpus=None) -> dict:
    """Where refdec's gap to the oracle chain lies, as tokens/step of hybrids.

    Each hybrid replays refdec's proposer (editing mode where the case has
    references, as the decoder does) and, at the steps a rule selects where the
    oracle chain's copied run is longer than what refdec accepted, advances by
    the oracle's run instead; the proposer is fed whatever was advanced, so the
    trajectory follows; the "wide" rules take refdec's own tree of
    CEILING_WIDE_NODES nodes instead (a perfect pick among its present
    candidates). "oracle wherever it copies more" reproduces the oracle
    chain (exactly, unless refdec's tree ever out-copies it: a path joined from
    several sources); each other rule says how much of the gap its steps hold; the "cursor"
    rule takes the longest copy from any of the cursor's candidates. The run's
    place in the reference is taken from its first <= 16 tokens and the copy
    cursor's anchor.
    """
    wl = workloads.load_workload(workload_name, limit)
    if corpus is None and wl.corpus:
        corpus = corpora.corpus_index(wl.corpus)
    return {"workload": workload_name, "budget": budget, "rules": ceiling_cases(wl.cases, budget, corpus)}


def ceiling_cases(cases, budget: int, corpus=None, rules=None) -> dict:
    """{rule name: tokens/step} of the hybrids of :func:`ceiling` over ``cases``
    (``workloads.Case``: prompt, references, output)."""
    import refdec

    out = {}
    rules = dict(rules) if rules is not None else {**CEILING_RULES, **CEILING_WIDE_RULES, **CEILING_CURSOR_RULES}
    for rule_name, rule in rules.items():
        wide = rule_name in CEILING_WIDE_RULES
        cursor = rule_name in CEILING_CURSOR_RULES
        tokens = steps = 0
        for case in cases:
            truth = case.output.tolist()
            reference = case.references[0].tolist() if case.references else []
            prop = refdec.Proposer(index=corpus, references=list(case.references) or None, max_depth=64,
                                   cursor=bool(case.references))
            oracle = baselines.OracleChain(case.output)
            prop.start(case.prompt)
            oracle.start(case.prompt)
            pos = 0
            while pos < len(truth):
                anchor = prop.cursor_state()["anchor"] if case.references else 0
                acc = accepted_length(prop.propose(budget), truth, pos)
                if cursor:
                    if case.references and rule(acc):
                        starts = [start for start, _, _ in prop.cursor_candidates()]
                        acc = max(acc, _longest_candidate_copy(reference, starts, truth, pos, budget))
                elif wide:
                    if rule(acc):
                        acc = max(acc, min(accepted_length(prop.propose(CEILING_WIDE_NODES), truth, pos), budget))
                else:
                    run_len = min(oracle.match_length(budget)[0], budget)
                    if run_len > acc and rule(acc, _reference_offsets(reference, truth[pos:pos + min(run_len, 16)],
                                                                      anchor)):
                        acc = run_len
                adv = min(acc + 1, len(truth) - pos)
                prop.accept(np.asarray(truth[pos:pos + adv], dtype=np.int32))
                oracle.accept(truth[pos:pos + adv])
                pos += adv
                steps += 1
            tokens += len(truth)
        out[rule_name] = tokens / max(steps, 1)
    return out


def print_ceiling(c: dict) -> None:
    oracle = c["rules"]["oracle wherever it copies more"]
    print(f"\n## Where refdec's gap to the oracle chain lies: {c['workload']}, k={c['budget']}")
    print("| hybrid: refdec, taking the oracle chain's run ... | tokens/step | / oracle chain |\n|---|---|---|")
    for name, value in c["rules"].items():
        print(f"| {name} | {value:.2f} | {value / oracle:.3f} |")


def print_diagnosis(d: dict, n_examples: int = 8) -> None:
    tok = tokens.tokenizer()
    print(f"\n## refdec vs {d['oracle']} on {d['workload']} at k={d['budget']} (refdec's trajectory)")
    print(f"steps {d['steps']}, output tokens {d['tokens']}, draft tokens accepted: refdec "
          f"{d['refdec_accepted']}, oracle from the same positions {d['oracle_accepted_same_positions']}")
    print("| loss kind | steps | tokens lost | median longest match len |\n|---|---|---|---|")
    for kind in LOSS_KINDS:
        print(f"| {kind} | {d['loss_steps'][kind]} | {d['lost_tokens'][kind]} | "
              f"{d['median_max_match_len'][kind]} |")
    print(f"\nwrong first token: rank of the true token among the continuations of the context's longest "
          f"matched suffix (root children in the tree: median {d['wrong_first_token_root_children_median']}):")
    print("  " + ", ".join(f"{k}: {v}" for k, v in d["wrong_first_token_rank"].items()))
    print(f"\nCursorLookup (nearest-to-cursor occurrence, one chain) on the same positions: accepts more "
          f"on {d['cursor_lookup_better']['steps']} steps (+{d['cursor_lookup_better']['tokens']} tokens), "
          f"fewer on {d['cursor_lookup_worse']['steps']} steps (-{d['cursor_lookup_worse']['tokens']} tokens)")
    shown = dict.fromkeys(LOSS_KINDS, 0)
    print("\nexamples (largest losses first):")
    for s in sorted(d["samples"], key=lambda s: s["accepted"] - s["oracle"]):
        if shown[s["kind"]] >= max(1, n_examples // 3):
            continue
        shown[s["kind"]] += 1
        dec = lambda ids: tok.decode(ids).replace("\n", "\\n")  # noqa: E731
        print(f"- [{s['kind']}] {s['case']} pos {s['pos']}: accepted {s['accepted']} vs oracle "
              f"{s['oracle']}, {s['nodes']} nodes, match lens {s['matches']}\n"
              f"    context ...{dec(s['context_tail'])!r}\n"
              f"    truth       {dec(s['truth'][:24])!r}\n"
              f"    refdec line {dec(s['best_path'][:24])!r}")


def markdown(results: dict, budgets) -> str:
    lines = []
    head = "| workload | method | " + " | ".join(f"k={b}" for b in budgets) + " | p50 / p99 µs (k=max) |"
    lines += [head, "|" + "---|" * (len(budgets) + 3)]
    for wname, w in results.items():
        meth = w["methods"]
        for mname, per in meth.items():
            cells = [f"{per[str(b)]['tokens_per_step']:.2f}" if str(b) in per else "" for b in budgets]
            last = per[str(budgets[-1])]
            lines.append(f"| {wname} | {mname} | " + " | ".join(cells)
                         + f" | {last['latency_us_p50']:.0f} / {last['latency_us_p99']:.0f} |")
        if "refdec" in meth and "oracle-chain" in meth:
            cells = [f"{meth['refdec'][str(b)]['tokens_per_step'] / meth['oracle-chain'][str(b)]['tokens_per_step']:.2f}"
                     for b in budgets]
            lines.append(f"| {wname} | refdec / oracle | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="edits,humaneval,summarization,rag")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    ap.add_argument("--budgets", default="8,16,32,64")
    ap.add_argument("--limit", type=int, default=None, help="cases per workload")
    ap.add_argument("--quick", action="store_true", help="5 cases per workload, budgets 8,32")
    ap.add_argument("--json", default=None, help="output JSON path (default benchmarks/out/simulate-<time>.json)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--diagnose", default=None, metavar="WORKLOAD:BUDGET[:ANCHOR]",
                    help="classify refdec's losses against the oracle chain (e.g. edits:32), or with ANCHOR=1 "
                         "against oracle-suffix1 (edits:32:1), and exit")
    ap.add_argument("--ceiling", default=None, metavar="WORKLOAD:BUDGET",
                    help="tokens/step of refdec/oracle-chain hybrids: where the gap to the oracle lies "
                         "(e.g. edits:64), and exit")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    budgets = [int(b) for b in args.budgets.split(",") if b]
    limit = args.limit
    if args.quick:
        budgets = [8, 32] if args.budgets == ap.get_default("budgets") else budgets
        limit = limit or 5
    wnames = [w for w in args.workloads.split(",") if w]
    methods = [m for m in args.methods.split(",") if m]
    if not data.data_dir().exists():
        print(f"data directory {data.data_dir()} not found (set REFDEC_DATA): nothing to do", file=sys.stderr)
        return 0
    if args.diagnose:
        wname, budget, *rest = args.diagnose.split(":")
        d = diagnose(wname, int(budget), limit, anchor=int(rest[0]) if rest else 0)
        print_diagnosis(d)
        report.write_result(report.result_path(args.json, f"diagnose-{wname}-{budget}{'-suffix1' if rest else ''}",
                                               timestamp=False), d, argv=argv)
        return 0
    if args.ceiling:
        wname, _, budget = args.ceiling.partition(":")
        if not wname or not budget.isdigit() or int(budget) < 1:
            ap.error(f"--ceiling takes WORKLOAD:BUDGET with BUDGET an int >= 1 (e.g. edits:64), got {args.ceiling!r}")
        c = ceiling(wname, int(budget), limit)
        print_ceiling(c)
        report.write_result(report.result_path(args.json, f"ceiling-{wname}-{budget}", timestamp=False), c,
                            argv=argv)
        return 0
    results = run(wnames, methods, budgets, limit, progress=not args.quiet)
    print(markdown(results, budgets))
    out = report.write_result(report.result_path(args.json, "simulate"),
                              {"budgets": budgets, "limit": limit, "results": results}, argv=argv)
    print(f"\nJSON: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
