"""The decoding engine: one propose → verify → accept loop for a batch of requests.

Modules, front to back:

* ``decoder``   -- ``generate`` / ``SpeculativeDecoder``: validate, make requests, lay out outputs
* ``arguments`` -- the call's arguments checked and normalised: prompts, references, seeds, sampling
  and logits settings, stops, the index
* ``requests``  -- one request's sequence, stops, drafter and budget
* ``engine``    -- the loop; ``scheduler`` (continuous batching), ``prefill``, ``drafts``
* ``verify``    -- one forward over the batch's trees + the acceptance walks (target selection)
* ``masks``     -- tree and prefill attention masks; ``batch`` -- the running batch's KV slots
* ``transfer``  -- host -> device copies without a host sync; ``static_step`` -- the verification
  forward at fixed shapes (query-row buckets, a static cache), replayable as a CUDA graph
* ``cache``     -- the KV cache and its row API; ``runner`` -- the model's forwards
* ``plain_head`` -- the LM head apart from the backbone; ``lazy_head`` -- the rows it runs on as the
  walks advance; ``accept`` -- the acceptance walk; ``sampling``, ``processors``
* ``model_support`` -- what refdec knows about model types; ``selfcheck`` -- the check for unverified ones
* ``stops``, ``results``

The public names are re-exported by ``refdec`` (``refdec.generate``, ``refdec.SpeculativeDecoder``,
``refdec.DecodingStats``, ``refdec.GenerateOutput``); this package imports nothing at import time.
"""
