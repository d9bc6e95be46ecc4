"""The transformers backend of the engine (refdec.engine.interface.Backend): a batch of draft
trees verified in one forward with a tree attention mask over refdec's own KV cache.

Modules:

* ``backend``   -- ``TransformersBackend``, what the engine drives, and its settings
* ``verify``    -- one forward over the batch's trees + the acceptance walks (target selection)
* ``masks``     -- tree and prefill attention masks; ``batch`` -- the running batch's KV slots
* ``prefill``   -- a joining group's prompts into the cache
* ``transfer``  -- host -> device copies without a host sync; ``static_step`` -- the verification
  forward at fixed shapes (query-row buckets, a static cache), replayable as a CUDA graph
* ``cache``     -- the KV cache and its row API; ``runner`` -- the model's forwards
* ``plain_head`` -- the LM head apart from the backbone; ``lazy_head`` -- the rows it runs on as the
  walks advance
* ``model_support`` -- what refdec knows about model types; ``selfcheck`` -- the check for unverified ones
* ``calibration`` -- the measured cost of a verification step by tree size ("auto" drafting)
"""
