"""refdec as the speculative proposer inside vLLM.

vLLM loads :class:`VllmProposer` through its ``custom_class`` speculative method::

    vllm serve MODEL --speculative-config \\
        '{"method": "custom_class", "model": "refdec.vllm.VllmProposer", "num_speculative_tokens": 16}'
    vllm.LLM(model=..., speculative_config=refdec.vllm.speculative_config(16))

vLLM owns the loop (continuous batching, tensor/pipeline parallelism) and verifies ONE chain
per request. Each step it calls ``propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu)`` with one row per *batch slot*; slots move as requests finish, so this adapter
keys its state by *request id*, which the runner hook in :func:`refdec.vllm.proposer.install_runner_hook` hands it
before each call (the batch's ``req_ids`` and vLLM's per-request states). Per request it keeps
one :class:`refdec.Proposer` (live context, the request's references with the copy cursor, the
server's corpus index), started from the prompt, advanced with the tokens vLLM accepted
(O(new tokens) a step), and freed when the request finishes or is preempted. refdec's draft
tree becomes the chain of highest expected accepted length less a price per drafted token
(:mod:`refdec.vllm.chain`): each node's acceptance probability is learnt from what vLLM
accepted (:class:`refdec.sizing.acceptance.AcceptanceTable`, one per worker), and the price is set each
step from the whole batch (:func:`token_price`), so a draft that will not pay is cut short or
not sent.

Server options are ``REFDEC_VLLM_*`` environment variables (a corpus index, the tree size, the
price of a drafted token, drafting on or off, threads), read in every vLLM process and validated
at start-up (an unknown name is an error): the names and defaults are in :mod:`refdec.vllm.options`
(``ENV_*``, :class:`~refdec.vllm.options.ServerOptions`), what each does in docs/vllm.md.

Per request (``SamplingParams(extra_args={...})``; over HTTP ``vllm_xargs``; on the OpenAI
server also Predicted Outputs' ``prediction={"type": "content", "content": "..."}``):
``refdec_references`` (a string or a list of strings: text to draft from, e.g. the file being
edited) and ``refdec_draft`` (false / 0 / "off": no drafts for this request). Other
``refdec_*`` keys are an error naming the key.
"""

from refdec.vllm.options import (DRAFT_KEY, PROPOSER_CLASS, REFERENCES_KEY, RequestOptions, ServerOptions,
                                 parse_request_options, speculative_config)
from refdec.vllm.chain import best_chain, token_price, walk_trees
from refdec.vllm.proposer import VllmProposer, load_index

__all__ = [
    "VllmProposer", "ServerOptions", "RequestOptions", "best_chain", "load_index", "parse_request_options",
    "token_price", "walk_trees",
    "speculative_config", "PROPOSER_CLASS", "REFERENCES_KEY", "DRAFT_KEY",
]
