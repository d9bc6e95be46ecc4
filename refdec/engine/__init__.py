"""The decoding engine: one propose → verify → accept loop for a batch of requests, written once
for every backend (no module here imports transformers, llama-cpp-python or vLLM, nor a backend
package, at import time; the decoder picks a backend by the model's type when it is made).

Modules, front to back:

* ``decoder``   -- ``generate`` / ``SpeculativeDecoder``: validate, make requests, lay out outputs
* ``settings``  -- ``DecodeSettings``: how one request decodes, checked once where it enters refdec
* ``arguments`` -- the call's arguments checked and normalised: prompts, references, seeds, the
  settings against the model (eos ids, logits settings, stops' tokenizer), the index
* ``requests``  -- one request's sequence, stops, drafter and budget
* ``engine``    -- the loop; ``scheduler`` (continuous batching), ``drafts`` (a step's draft)
* ``interface`` -- what the loop asks of a backend (``Backend``, ``RunningBatch``), what a
  verification step gives (``Verified``) and the target rules
* ``accept``    -- the acceptance walks; ``sampling``, ``processors`` -- how a target is chosen
* ``stops``, ``results``

The backends: refdec.transformers (a tree attention mask over refdec's own KV cache) and
refdec.llama_cpp (sequence ids in one ``llama_decode``). The public names are re-exported by
``refdec`` (``refdec.generate``, ``refdec.SpeculativeDecoder``, ``refdec.DecodingStats``,
``refdec.GenerateOutput``).
"""
