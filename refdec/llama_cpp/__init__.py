"""refdec on llama.cpp (llama-cpp-python): ``refdec.generate(llm, ...)`` with a ``llama_cpp.Llama``.

* ``api``         -- every llama-cpp-python call refdec makes (one pinned version), the tree context
* ``backend``     -- the engine's llama.cpp backend: trees in one ``llama_decode``, the KV sequences
* ``calibration`` -- this backend's cost curve (backbone rows and logits rows apart)
* ``tokenizer``   -- the GGUF model's tokenizer with the interface refdec uses
* ``plain``       -- llama.cpp's own plain greedy decoding, for comparisons

Nothing here is imported by ``import refdec``; llama-cpp-python is needed only when used.
"""
