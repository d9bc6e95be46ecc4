"""A GGUF model's own tokenizer (llama.cpp's), with the part of the transformers tokenizer
interface refdec uses: encode / ``__call__``, decode, the chat template, the vocabulary."""

from __future__ import annotations

from pathlib import Path

from refdec.llama_cpp.api import chat_template, chat_template_prompt

__all__ = ["GgufTokenizer"]

_FINGERPRINTS: dict[str, str] = {}


class GgufTokenizer:
    """The tokenizer of ``llm`` (a ``llama_cpp.Llama``): the same token ids llama.cpp decodes."""

    def __init__(self, llm) -> None:
        self.llm = llm
        eos = llm.token_eos()
        self.eos_token_id = None if eos < 0 else int(eos)
        self.model_path = str(llm.model_path)

    @property
    def chat_template(self) -> str | None:
        """The GGUF file's chat template (``tokenizer.chat_template``), None without one."""
        return chat_template(self.llm)

    def __len__(self) -> int:
        return int(self.llm.n_vocab())

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens``: the BOS token where the model adds one.
        Special tokens written in the text (``<|im_start|>``) are parsed as such."""
        return [int(t) for t in self.llm.tokenize(text.encode("utf-8"), add_bos=add_special_tokens, special=True)]

    def __call__(self, text, add_special_tokens: bool = True, return_tensors: str | None = None) -> dict:
        """``{"input_ids": ids}`` of ``text`` (a str), or of each text of a list (a list of id lists,
        as a transformers tokenizer answers a batch: what refdec.CorpusIndex.build sends);
        ``return_tensors="pt"``: one text's ids as a LongTensor [1, L]."""
        if isinstance(text, (list, tuple)):
            if return_tensors is not None:
                raise ValueError("return_tensors must be None for a list of texts")
            return {"input_ids": [self.encode(t, add_special_tokens) for t in text]}
        ids = self.encode(text, add_special_tokens)
        if return_tensors == "pt":
            import torch

            return {"input_ids": torch.tensor([ids], dtype=torch.long)}
        if return_tensors is not None:
            raise ValueError(f"return_tensors must be None or 'pt', got {return_tensors!r}")
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [int(t) for t in (ids.tolist() if hasattr(ids, "tolist") else ids)]
        return self.llm.detokenize(ids, special=not skip_special_tokens).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False):
        """The prompt of ``messages`` through the GGUF file's chat template (text, or its ids)."""
        text = chat_template_prompt(self.llm, messages, add_generation_prompt)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def fingerprint(self) -> str:
        """The fingerprint (refdec.drafting.index.tokenizer_fingerprint) of this model's tokenizer as
        transformers reads it from the GGUF file: what ``refdec index build`` records when it
        tokenizes with the converted model. Read once per file (seconds; needs transformers)."""
        cached = _FINGERPRINTS.get(self.model_path)
        if cached is None:
            from transformers import AutoTokenizer

            from refdec.drafting.index import tokenizer_fingerprint

            path = Path(self.model_path)
            cached = tokenizer_fingerprint(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name))
            _FINGERPRINTS[self.model_path] = cached
        return cached
