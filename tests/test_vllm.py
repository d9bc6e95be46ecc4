"""Specifies the refdec.vllm package inside vLLM, end to end (needs vLLM; its own bounded CI step,
`.ci/run`): greedy outputs with refdec's proposer equal vLLM's without speculation, per-request
references reach their own request, a corpus index drafts, bad input is that request's error
(the plugin's validation hook), and the OpenAI server maps Predicted Outputs to references and
reports prediction tokens in usage (the plugin's server hooks). Its modules without vLLM:
tests/test_vllm_<module>.py.

The model is a small random-weight Llama saved to a temporary directory (no hub). Engines are
started once per module (each start takes ~25 s on a CPU): vLLM without speculation, vLLM with
refdec and a corpus index, and one `vllm serve` with refdec.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm]')")

import refdec  # noqa: E402
from refdec import vllm as rv
from refdec.vllm import chain as vllm_chain, options as vllm_options  # noqa: E402

K = 8
MAX_MODEL_LEN = 1024
ENGINE_ARGS = dict(dtype="float32", enforce_eager=True, max_model_len=MAX_MODEL_LEN, max_num_seqs=16, seed=0)

# Eight prompts of different lengths, max_tokens different so that requests finish at different
# times and vLLM's batch slots move (a finished request's slot is filled by the last one).
PROMPTS = [
    "def fib(n): return fib(n-1) + fib(n-2)\n" * 3,
    "hello world " * 10,
    "abc",
    "The quick brown fox jumps over the lazy dog. " * 4,
    "for i in range(10):\n    print(i)\n" * 2,
    "x = 1\ny = 2\nz = x + y\n",
    "lorem ipsum dolor sit amet, " * 6,
    "0123456789" * 5,
]
MAX_TOKENS = [96, 24, 64, 40, 80, 16, 56, 32]
# Prompts whose greedy outputs make the corpus (not the prompts under test).
CORPUS_PROMPTS = ["int main() { return 0; }\n", "SELECT * FROM t WHERE a = 1;\n"]
# Two prompts whose first tokens the model does not repeat (so little is drafted without the right
# reference), generated with ignore_eos, for the reference-identity and server tests.
ID_PROMPTS = ["Vortex jam plum 3% ", "riGp#58WAm dX3a5IDnO"]


def _save_tiny_model(path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny_models import char_tokenizer

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                      initializer_range=0.02)
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # sharper logits: greedy falls into loops that drafts partly predict
        model.model.embed_tokens.weight.mul_(3.0)
        model.lm_head.weight.mul_(3.0)
    model.save_pretrained(path)
    tok = char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # for the chat endpoint
    tok.save_pretrained(path)
    return tok


def _shutdown(llm):
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # best effort: the processes end with the test session anyway
        pass


@pytest.fixture(scope="module")
def env_guard():
    saved = {k: os.environ.get(k) for k in vllm_options.ENV_NAMES + ("VLLM_CPU_KVCACHE_SPACE",)}
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, env_guard):
    path = tmp_path_factory.mktemp("tiny-llama")
    _save_tiny_model(path)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _greedy(max_tokens, **extra):
    return vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens, **extra)


def _id_params(max_tokens, **extra):
    return _greedy(max_tokens, ignore_eos=True, **extra)


@pytest.fixture(scope="module")
def baseline(model_dir):
    """vLLM without speculation: prompt -> (max_tokens -> token ids), for every prompt used here."""
    llm = vllm.LLM(model=model_dir, **ENGINE_ARGS)
    jobs = list(zip(PROMPTS, MAX_TOKENS)) + [(p, 64) for p in CORPUS_PROMPTS]
    id_jobs = [(p, n) for n in (24, 64) for p in ID_PROMPTS]
    outs = llm.generate([p for p, _ in jobs + id_jobs],
                        [_greedy(n) for _, n in jobs] + [_id_params(n) for _, n in id_jobs])
    jobs += [(p, ("ignore_eos", n)) for p, n in id_jobs]
    _shutdown(llm)
    result: dict[tuple[str, int], list[int]] = {}
    for (prompt, n), out in zip(jobs, outs):
        result[(prompt, n)] = list(out.outputs[0].token_ids)
    return result


@pytest.fixture(scope="module")
def refdec_llm(model_dir, tokenizer, baseline, tmp_path_factory):
    """vLLM with refdec's proposer and a corpus index built from the corpus prompts' outputs."""
    texts = [tokenizer.decode(baseline[(p, 64)]) for p in CORPUS_PROMPTS]
    index_path = tmp_path_factory.mktemp("index") / "corpus.refdec"
    refdec.CorpusIndex.build(texts, tokenizer=tokenizer).save(index_path)
    os.environ["REFDEC_VLLM_INDEX"] = str(index_path)
    try:
        llm = vllm.LLM(model=model_dir, speculative_config=rv.speculative_config(K),
                       per_request_spec_decode_metrics="summary", **ENGINE_ARGS)
    finally:
        os.environ.pop("REFDEC_VLLM_INDEX", None)
    yield llm
    _shutdown(llm)


def _accepted(out):
    metrics = out.outputs[0].spec_decode_metrics
    return sum(j * c for j, c in enumerate(metrics.histogram)), metrics.num_draft_tokens


def test_greedy_single_requests_equal_no_speculation(refdec_llm, baseline):
    drafted = 0
    for prompt, n in zip(PROMPTS[:3], MAX_TOKENS[:3]):
        out = refdec_llm.generate([prompt], _greedy(n))[0]
        assert list(out.outputs[0].token_ids) == baseline[(prompt, n)], prompt
        drafted += _accepted(out)[1]
    assert drafted > 0  # refdec did draft (the test is not vacuous)


def test_greedy_concurrent_requests_finishing_at_different_times_equal_no_speculation(refdec_llm, baseline):
    outs = refdec_llm.generate(PROMPTS, [_greedy(n) for n in MAX_TOKENS])
    accepted = 0
    for prompt, n, out in zip(PROMPTS, MAX_TOKENS, outs):
        assert list(out.outputs[0].token_ids) == baseline[(prompt, n)], prompt
        accepted += _accepted(out)[0]
    assert accepted > 0


def test_greedy_with_references_equals_no_speculation(refdec_llm, baseline, tokenizer):
    params = []
    for i, (prompt, n) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        # every other request brings a reference: the right output, or an unrelated text
        ref = tokenizer.decode(baseline[(prompt, n)]) if i % 4 == 0 else "an unrelated reference text\n" * 3
        params.append(_greedy(n, extra_args={"refdec_references": [ref]}) if i % 2 == 0 else _greedy(n))
    outs = refdec_llm.generate(PROMPTS, params)
    for prompt, n, out in zip(PROMPTS, MAX_TOKENS, outs):
        assert list(out.outputs[0].token_ids) == baseline[(prompt, n)], prompt


def test_corpus_index_drafts_a_continuation_it_holds(refdec_llm, baseline):
    # The corpus holds this prompt's output: after a few tokens the index drafts the rest.
    prompt = CORPUS_PROMPTS[0]
    out = refdec_llm.generate([prompt], _greedy(64, extra_args={"refdec_draft": True}))[0]
    assert list(out.outputs[0].token_ids) == baseline[(prompt, 64)]
    accepted, _ = _accepted(out)
    assert accepted >= 32, accepted


def test_each_request_drafts_from_its_own_reference(refdec_llm, baseline, tokenizer):
    """Two concurrent requests, each with its own output as its reference, then with each
    other's: accepted drafts follow the request's own reference, not a batch slot's neighbour
    (measured: 20 of 24 accepted with the own reference, 3-6 with the other's)."""
    a, b = ID_PROMPTS
    out_a, out_b = (tokenizer.decode(baseline[(p, ("ignore_eos", 24))]) for p in ID_PROMPTS)

    def run(ref_a, ref_b):
        outs = refdec_llm.generate([a, b], [_id_params(24, extra_args={"refdec_references": ref_a}),
                                            _id_params(24, extra_args={"refdec_references": ref_b})])
        for prompt, out in zip(ID_PROMPTS, outs):
            assert list(out.outputs[0].token_ids) == baseline[(prompt, ("ignore_eos", 24))]
        return [_accepted(o)[0] for o in outs]

    own = run(out_a, out_b)
    swapped = run(out_b, out_a)
    off = [_accepted(o)[0] for o in refdec_llm.generate(
        [a, b], [_id_params(24, extra_args={"refdec_references": r, "refdec_draft": False}) for r in (out_a, out_b)])]
    assert off == [0, 0]
    for i in range(2):
        assert own[i] >= 16, own          # 24 tokens, copied from the own reference in a few steps
        assert own[i] >= swapped[i] + 8, (own, swapped)


@pytest.mark.parametrize("extra_args, message", [
    ({"refdec_references": 5}, "refdec_references must be a string or a list of strings"),
    ({"refdec_references": ["ok", {"a": 1}]}, "refdec_references must be a string or a list of strings"),
    ({"refdec_references": ""}, "refdec_references\\[0\\] is an empty string"),
    ({"refdec_references": "x" * 10_000_000}, "more than the server's limit"),
    ({"refdec_refs": "typo"}, "unknown refdec request option"),
    ({"refdec_draft": "maybe"}, "refdec_draft must be true or false"),
])
def test_bad_request_is_that_requests_error_and_the_engine_keeps_serving(refdec_llm, baseline, extra_args, message):
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match=message):
        refdec_llm.generate(["abc"], _greedy(8, extra_args=extra_args))
    prompt, n = PROMPTS[1], MAX_TOKENS[1]
    out = refdec_llm.generate([prompt], _greedy(n))[0]
    assert list(out.outputs[0].token_ids) == baseline[(prompt, n)]


def _start_fails(model_dir, env, message):
    """A vLLM start with refdec and these options fails, naming the problem."""
    code = ("import vllm, refdec.vllm as rv\n"
            "if __name__ == '__main__':\n"
            f"    vllm.LLM(model={model_dir!r}, speculative_config=rv.speculative_config({K}), "
            "**{'dtype': 'float32', 'enforce_eager': True, 'max_model_len': 256})\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]


def test_index_built_with_another_tokenizer_fails_at_start(model_dir, tmp_path):
    from tiny_models import byte_tokenizer

    path = tmp_path / "other.refdec"
    refdec.CorpusIndex.build(["some text"], tokenizer=byte_tokenizer()).save(path)
    _start_fails(model_dir, {"REFDEC_VLLM_INDEX": str(path)}, "was built with tokenizer fingerprint")


def test_unknown_option_fails_at_start(model_dir):
    _start_fails(model_dir, {"REFDEC_VLLM_DRAFTCOST": "0.2"}, "unknown refdec vLLM option(s) ['REFDEC_VLLM_DRAFTCOST']")


# ---------------------------------------------------------------------------------------------
# The OpenAI-compatible server


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def serve_command(model_dir):
    """``vllm serve MODEL``; with vllm-cpu 0.32.0, whose ``vllm`` command stops at
    ``importlib.metadata.version("vllm")`` (its distribution is named vllm-cpu), the same server
    as ``python -m vllm.entrypoints.openai.api_server --model MODEL``."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    return [os.path.join(os.path.dirname(sys.executable), "vllm"), "serve", model_dir]


@pytest.fixture(scope="module")
def server(model_dir, baseline):
    port = _free_port()
    cmd = serve_command(model_dir) + ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
           "--max-num-seqs", "16", "--seed", "0", "--per-request-spec-decode-metrics", "summary",
           "--speculative-config", json.dumps(rv.speculative_config(K))]
    log = open(os.path.join(model_dir, "serve.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(base + "/health", timeout=2):
                break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
    if proc.poll() is not None:
        log.close()
        pytest.fail("vllm serve did not start:\n" + open(log.name).read()[-3000:])
    yield base
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_server_prediction_drafts_from_the_prediction_and_reports_usage(server, baseline, model_dir, tokenizer):
    prompt = ID_PROMPTS[0]
    expected = baseline[(prompt, ("ignore_eos", 64))]
    predicted = tokenizer.decode(expected)
    status, body = _post(server + "/v1/completions", {
        "model": model_dir, "prompt": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
        "prediction": {"type": "content", "content": predicted}, "return_token_ids": True})
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == expected
    details = body["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] >= 40, details
    assert details["accepted_prediction_tokens"] == body["metrics"]["speculative_decoding"]["num_accepted_draft_tokens"]
    assert details["rejected_prediction_tokens"] >= 0
    # the same over vllm_xargs, and without: fewer accepted without the prediction
    status, plain = _post(server + "/v1/completions", {
        "model": model_dir, "prompt": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True})
    assert status == 200 and plain["choices"][0]["token_ids"] == expected
    assert plain["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] + 20 <= \
        details["accepted_prediction_tokens"]
    status, xargs = _post(server + "/v1/completions", {
        "model": model_dir, "prompt": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True,
        "vllm_xargs": {"refdec_references": [predicted]}})
    assert status == 200 and xargs["choices"][0]["token_ids"] == expected
    assert xargs["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] >= 40


@pytest.mark.parametrize("extra, message", [
    ({"prediction": {"type": "content", "content": 5}}, "prediction.content must be a string"),
    ({"prediction": "just text"}, "prediction must be an object"),
    ({"vllm_xargs": {"refdec_references": 5}}, "refdec_references must be a string or a list of strings"),
    ({"vllm_xargs": {"refdec_nope": 1}}, "unknown refdec request option"),
    ({"prediction": {"type": "content", "content": "y" * 2_000_000}}, "more than the server's limit"),
])
def test_server_bad_input_is_a_400_and_the_server_keeps_serving(server, baseline, model_dir, extra, message):
    status, body = _post(server + "/v1/completions", {"model": model_dir, "prompt": "abc", "max_tokens": 8,
                                                      "temperature": 0, **extra})
    assert status == 400, body
    assert message in json.dumps(body), body
    prompt, n = PROMPTS[1], MAX_TOKENS[1]
    status, body = _post(server + "/v1/completions", {"model": model_dir, "prompt": prompt, "max_tokens": n,
                                                      "temperature": 0, "return_token_ids": True})
    assert status == 200 and body["choices"][0]["token_ids"] == baseline[(prompt, n)]


def test_server_chat_prediction(server, model_dir, baseline, tokenizer):
    # the tiny model's chat template is the messages' text: the chat prompt equals ID_PROMPTS[0]
    expected = baseline[(ID_PROMPTS[0], ("ignore_eos", 64))]
    status, body = _post(server + "/v1/chat/completions", {
        "model": model_dir, "messages": [{"role": "user", "content": ID_PROMPTS[0]}], "max_tokens": 64,
        "temperature": 0, "ignore_eos": True,
        "prediction": {"type": "content", "content": [{"type": "text", "text": tokenizer.decode(expected)}]}})
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert body["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] >= 40, body["usage"]


# ---------------------------------------------------------------------------------------------
# The default model, as refdec.models.vllm_model_dir writes it


def test_default_model_loads_in_vllm_and_its_greedy_tokens_match_transformers():
    """vLLM builds the causal LM (config.json's architectures) with its tied embedding filled
    (model.embed_tokens.weight): greedy tokens equal transformers' (skipped unless the default
    model was converted already: ~/.cache/refdec/gemma-3-270m; converting takes minutes)."""
    from refdec.models import default_model_dir, load_model, vllm_model_dir

    if not (default_model_dir() / "config.json").exists():
        pytest.skip("the default model is not converted (refdec.models.load_default() converts it)")
    import torch

    model, tok = load_model(str(default_model_dir()))
    prompt = "def fibonacci(n):\n    "
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                                  do_sample=False)[0, ids.shape[1]:].tolist()
    del model
    llm = vllm.LLM(model=str(vllm_model_dir()), dtype="float32", enforce_eager=True, max_model_len=512, seed=0)
    try:
        out = llm.generate([prompt], _greedy(24))[0]
    finally:
        _shutdown(llm)
    assert list(out.outputs[0].token_ids) == expected
    assert len(set(expected)) > 1  # not the all-id-0 output of an empty embedding


def test_the_readmes_vllm_snippets_run(server, refdec_llm, model_dir, tmp_path, monkeypatch):
    """The vLLM snippets of the pages in tests/test_readme.py's VLLM_PAGES: the client snippet
    against this module's server and the ``vllm.LLM`` snippet, in one namespace as a reader pastes
    them. Stand-ins, as the pages leave them to the reader: ``MODEL`` is this module's tiny model,
    ``app.py`` a small file, the server's address this module's port, ``max_tokens`` within the
    tiny model's window, and ``vllm.LLM(...)`` returns the engine this module started with refdec
    (one more engine start costs ~25 s); its arguments are checked to be the snippet's."""
    from test_readme import REPO, VLLM_PAGES, needs_vllm, readme_blocks

    blocks = [b for page in VLLM_PAGES for b in readme_blocks(REPO / page) if b.language == "python" and needs_vllm(b)]
    assert len(blocks) == 2, f"{VLLM_PAGES} hold a client snippet and a vllm.LLM snippet"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app.py").write_text("def foo(x):\n    return foo_helper(x) + 1\n" * 3)
    llm_calls = []
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: llm_calls.append(kwargs) or refdec_llm)
    namespace = {"MODEL": model_dir}
    for block in blocks:
        code = block.text.replace("http://localhost:8000/v1", server + "/v1")
        code = code.replace("max_tokens=1024", "max_tokens=64").replace("max_tokens=512", "max_tokens=64")
        exec(compile(code, block.where, "exec"), namespace)
    details = namespace["resp"].usage.completion_tokens_details
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0
    assert llm_calls == [dict(model=model_dir, dtype="float32", speculative_config=rv.speculative_config(16))]
    assert namespace["out"][0].outputs[0].token_ids
