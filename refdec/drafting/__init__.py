"""Drafting: what proposes a request's draft tree, and the indexes it drafts from.

Modules: refdec.drafting.index (the on-disk corpus index, shards of one, the live context's
index, documents tokenised for them), refdec.drafting.proposer (one request's drafter over its
sources: context, references, corpus, memory), refdec.drafting.memory (past outputs, bounded, per
tenant), refdec.drafting.implicit (the file a prompt holds: its implicit reference),
refdec.drafting.retrieval (MinHash retrieval of the corpus documents most like a prompt) and
refdec.drafting.tree (the draft tree and a batch of them). Nothing here knows a model: the
engine (refdec.engine) verifies what these propose, refdec.sizing chooses how much of it.
"""
