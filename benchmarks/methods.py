"""The methods the end-to-end runs compare on transformers, one prompt at a time (``e2e.py``'s
``--methods``), and how one method's output is compared with another's.

    hf-greedy      model.generate(do_sample=False)
    hf-sample      (--sample) model.generate(do_sample=True, temperature=..., top_k=..., top_p=...)
    hf-pld         model.generate(do_sample=False, prompt_lookup_num_tokens=10)
    refdec-auto    refdec, max_draft_tokens="auto" (the cost-curve budget, refdec.sizing.budget.AutoBudget)
    refdec-chain   the same proposer cut to its best path (one chain, no tree), "auto" budget
    refdec-auto-nostart  refdec-auto without the copy cursor's start alignment (editing:
                   CursorParams(start_run=0), the first step's copy of the file's top as before)
    refdec-N       refdec with a fixed budget of N nodes (e.g. refdec-16, refdec-64); refdec-0 is
                   plain decoding through refdec's loop (its verifier head: no drafts at all)
    peer-pld       HF's prompt-lookup algorithm (2..1-gram, first occurrence, 10-token chain,
                   benchmarks/baselines.PromptLookup) in refdec's verifier: the verifier's share
    peer-arctic    ArcticInference's SuffixDecodingCache (if installed) as the proposer in
                   refdec's verifier, "auto" budget: the proposer's share
    M+stdlib       refdec method M with the stdlib CorpusIndex whatever the workload's own
                   index (e.g. refdec-auto+stdlib on edits: the corpus drafts new code)

Batched runs (``e2e.py --batch``, benchmarks/batching.py) take ``refdec-auto``, ``refdec-N`` and
``refdec-auto-rowwise`` ("auto" with each row priced alone).
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks import baselines, corpora

AUTO_METHODS = ("refdec-auto", "refdec-auto-nostart", "refdec-auto-rowwise", "refdec-chain", "peer-arctic")


def draft_budget(base: str):
    """The ``max_draft_tokens`` of method ``base`` (no ``+corpus`` suffix): "auto" or a node count."""
    if base in AUTO_METHODS:
        return "auto"
    if base == "peer-pld":
        return 10  # prompt_lookup_num_tokens=10, as hf-pld
    prefix, _, nodes = base.rpartition("-")
    if prefix != "refdec" or not nodes.isdigit():
        raise ValueError(f"unknown method {base!r}; expected refdec-auto, refdec-N, refdec-chain, peer-pld, ...")
    return int(nodes)


def first_difference(tokens: list, reference: list) -> int | None:
    """The first position where ``tokens`` and ``reference`` differ (the shorter one's length when
    one is a prefix of the other), or None when they are identical."""
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
    if first is None and len(tokens) != len(reference):
        first = min(len(tokens), len(reference))
    return first


# ---------------------------------------------------------------- proposers

class WrappedProposer:
    """Passes the drafter protocol (start / accept / propose) to ``inner``."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def start(self, prompt_ids):
        self.inner.start(prompt_ids)

    def accept(self, tokens):
        self.inner.accept(tokens)

    def propose(self, max_nodes):
        return self.inner.propose(max_nodes)


class ChainProposer(WrappedProposer):
    """Wraps a Proposer: keeps only the best path of each tree (the ablation "no tree").

    The best path starts at the first child of the root and follows the first child of
    each node: nodes come best-first, so the first child is the most probable one."""

    def propose(self, max_nodes):
        from refdec import DraftTree

        tree = self.inner.propose(max_nodes)
        if len(tree) == 0:
            return tree
        parents = tree.parents.tolist()
        path, want = [], -1
        for node_idx, parent in enumerate(parents):
            if parent == want:
                path.append(node_idx)
                want = node_idx
        keep = np.asarray(path, dtype=np.int64)
        return DraftTree(tree.token_ids[keep], np.arange(-1, len(keep) - 1, dtype=np.int32), tree.scores[keep],
                         tree.source_ids[keep], source_names=tree.source_names, depths=tree.depths[keep])


class PeerProposer(WrappedProposer):
    """A baseline drafter (benchmarks/baselines.py: start / accept / propose), named."""

    def __init__(self, inner, name: str) -> None:
        super().__init__(inner)
        self.name = name


def peer_factory(method: str):
    def make(index, references, max_depth):
        if method == "peer-pld":  # transformers' PromptLookupCandidateGenerator rule
            return PeerProposer(baselines.PromptLookup(max_ngram=2, occurrence="first"), "pld")
        if method == "peer-arctic":
            if not baselines.arctic_available():
                raise RuntimeError("peer-arctic needs arctic_inference (pip install arctic-inference)")
            return PeerProposer(baselines.ArcticSuffix(), "arctic")
        raise ValueError(f"unknown peer method {method!r}")

    return make


def proposer_factory(editing: bool, chain: bool, start: bool = True):
    """``start=False``: the copy cursor without its start alignment (CursorParams.start_run=0)."""
    def make(index, references, max_depth):
        from refdec import Proposer
        from refdec.drafting.proposer import CursorParams

        cursor = (CursorParams() if start else CursorParams(start_run=0)) if editing else None
        inner = Proposer(index=index, references=references or None, max_depth=max_depth, cursor=cursor)
        return ChainProposer(inner) if chain else inner

    return make


# ---------------------------------------------------------------- running

class Runner:
    """Runs one method on one prompt (``run``): its tokens, seconds and refdec's statistics."""

    def __init__(self, model, tokenizer, max_new_tokens: int, edits_max_new_tokens: int | None = None,
                 sampling: dict | None = None) -> None:
        self.model = model
        self.sampling = sampling  # None = greedy, else temperature / top_k / top_p / seed
        self.tokenizer = tokenizer
        self.default_max_new_tokens = max_new_tokens
        self.edits_max_new_tokens = edits_max_new_tokens or max_new_tokens
        self.decoders: dict = {}
        self.stdlib_index = None

    def decoder(self, method: str, base: str, workload: str, index, editing: bool):
        """One SpeculativeDecoder per (method, workload): "auto" learns within a workload.
        ``base``: the method without its ``+corpus`` suffix (it picks the proposer)."""
        from refdec import SpeculativeDecoder

        key = (method, workload)
        if key not in self.decoders:
            factory = (peer_factory(base) if base.startswith("peer-")
                       else proposer_factory(editing, base == "refdec-chain", start=base != "refdec-auto-nostart"))
            # prefix_cache=0: each case prefills its prompt from scratch, as the baselines do
            self.decoders[key] = SpeculativeDecoder(self.model, self.tokenizer, index=index,
                                                    proposer_factory=factory, prefix_cache=0)
        return self.decoders[key]

    def run(self, method: str, workload: str, case, index, editing: bool) -> dict:
        import torch

        ids = torch.tensor([case.prompt.tolist()], dtype=torch.long)
        self.max_new_tokens = self.edits_max_new_tokens if workload.startswith("edits") else self.default_max_new_tokens
        rec = {"method": method}
        if method.startswith("hf-"):
            kwargs = dict(do_sample=False, max_new_tokens=self.max_new_tokens, attention_mask=torch.ones_like(ids),
                          pad_token_id=self.tokenizer.pad_token_id)
            if method == "hf-pld":
                kwargs["prompt_lookup_num_tokens"] = 10
            if method == "hf-sample":
                sp = self.sampling
                # explicit: the model's generation_config may carry its own top_k / top_p
                kwargs.update(do_sample=True, temperature=sp["temperature"], top_k=sp["top_k"] or 0,
                              top_p=sp["top_p"] if sp["top_p"] is not None else 1.0)
                torch.manual_seed(sp["seed"])
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.model.generate(ids, **kwargs)
            seconds = time.perf_counter() - t0
            tokens = out[0, ids.shape[1]:].tolist()
            rec.update(seconds=seconds, new_tokens=len(tokens), tokens=tokens)
            return rec
        base, _, corpus = method.partition("+")
        if corpus:
            if corpus != "stdlib":
                raise ValueError(f"unknown corpus suffix in method {method!r}; expected '+stdlib'")
            if self.stdlib_index is None:  # loaded once (~5 s), outside any timing
                self.stdlib_index = corpora.corpus_index("stdlib")
            index = self.stdlib_index
        budget = draft_budget(base)
        decoder = self.decoder(method, base, workload, index, editing)
        refs = [r.tolist() for r in case.references] or None
        t0 = time.perf_counter()
        sample_kwargs = {} if self.sampling is None else dict(do_sample=True, **self.sampling)
        out = decoder.generate(ids, references=refs, max_new_tokens=self.max_new_tokens,
                               max_draft_tokens=budget, **sample_kwargs)
        seconds = time.perf_counter() - t0
        tokens = out.sequences[0, ids.shape[1]:].tolist()
        s = out.stats
        rec.update(seconds=seconds, new_tokens=len(tokens), tokens=tokens, passes=s.forward_passes,
                   tokens_per_pass=s.tokens_per_pass, proposed=s.proposed_tokens, accepted=s.accepted_tokens,
                   accepted_by_source=dict(s.accepted_by_source),
                   head_rows=s.head_rows,
                   split={"prefill": s.prefill_seconds, "propose": s.propose_seconds,
                          "prepare": s.prepare_seconds, "forward": s.forward_seconds,
                          "accept": s.accept_seconds})
        return rec
