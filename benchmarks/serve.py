"""Local OpenAI servers side by side on instructed edits: refdec serve against llama-cpp-python's server and llama.cpp's llama-server.

    python -m benchmarks.serve [--edits 4] [--clients 1,2,4] [--servers refdec,lcp,lcp-pld,ls,ls-ngram-mod]
                               [--model F.gguf] [--threads 2] [--max-tokens 1536] [--json OUT]
    python -m benchmarks.serve --follow-up [--edits 3] [--servers refdec,refdec-nocache,lcp,ls,ls-ngram-mod]
    python -m benchmarks.serve --no-prediction [--servers refdec,refdec-noimplicit,lcp,ls-ngram-mod]
    python -m benchmarks.serve --aider /path/to/venv/bin/aider [--edit-formats whole,diff] [--servers refdec,lcp]

Each edit of ``../shared/data/edits-click.jsonl`` (its commit message as the instruction, the
file before it as the text) is sent through the ``openai`` client as ``refdec edit --server``
sends it: chat messages (refdec.edit_prompt.chat_edit_messages), ``prediction`` = the original
file, greedy. Servers (all started here at once; they take turns, edit by edit at one client and
round by round at more, so the shared machine's slow and fast phases fall on each alike):

    refdec          refdec serve (--max-concurrent 4)
    lcp, lcp-pld    python -m llama_cpp.server, plain and --draft_model prompt-lookup-decoding
                    (it ignores ``prediction``; it serves one request at a time)
    ls, ls-ngram-mod, ls-ngram-map-k
                    llama-server built from the llama.cpp that llama-cpp-python's sdist vendors
                    (built once into ~/.cache/refdec/llama-server-build, never in CI), plain and
                    with its model-free drafting --spec-type ngram-mod / ngram-map-k (-np 4)

At each number of concurrent clients, every edit is sent once (the clients take them in turn):
per request tokens/s (completion tokens over its latency) and latency, the total tokens/s (all
tokens over the wall time), accepted prediction tokens where the server reports them, and how
many replies equal refdec's at one client. Every server prefills each request from scratch here
(refdec ``--prefix-cache 0``, llama-server ``--no-cache-prompt``): the edits repeat per client count.

``refdec-trees`` is refdec serve with ``--no-exact``: draft trees in llama.cpp's batched kernels, as
llama-server's speculative decoding runs them, in place of exact mode's chains (the price of
exact mode's plain-decoding tokens). ``refdec-chunk128`` is refdec serve with ``--prefill-chunk
128``: exact mode reuses a cached prompt in whole chunks (with ``--follow-up``, ``--aider``).

``--no-prediction``: the requests send the file in the prompt only, as most editing tools do;
``refdec-noimplicit`` is refdec serve with ``--no-implicit-reference`` (drafting from the context
alone), to compare with refdec's implicit reference, the largest fenced block of the messages.

``--aider AIDER``: a real client, aider (``aider-chat`` from PyPI, in a venv of its own; AIDER its
executable), edits each file through each server (``--edit-formats``, default ``whole,diff``): one
aider run per edit and format, in a fresh folder holding the file alone, ``--no-git --yes-always``,
offline (``LITELLM_LOCAL_MODEL_COST_MAP``). Every server keeps its prompt cache, as users run it:
aider sends the conversation again when a reply fails to apply, and llama-cpp-python's server
always reuses its last prompt's prefix. Reported: each run's wall time (aider's start included,
alike for every server), whether the file changed, and the files that equal refdec's.

``--follow-up``: the same file edited again. One client sends each edit and then, at once, a
second edit of the same file (:data:`FOLLOW_UP` as the instruction; the prompt shares the system
prompt and the file with the first); each server keeps its prompt cache as a user runs it
(refdec's prefix cache, llama-server's ``cache_prompt``, llama-cpp-python's reuse of its last
prompt's prefix). ``refdec-nocache`` is refdec serve with ``--prefix-cache 0``. Reported: the
latency of the first and of the follow-up request, the prompt tokens the follow-up reused
(``usage.prompt_tokens_details.cached_tokens`` where the server reports it) and its tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks import data

SERVERS = ("refdec", "lcp", "lcp-pld", "ls", "ls-ngram-mod", "ls-ngram-map-k", "refdec-nocache", "refdec-noimplicit",
           "refdec-trees", "refdec-chunk128")
FOLLOW_UP = "Also add a one-line comment at the very top of the file that says what the file is for."
MODEL_ID = "editor"  # the id every server answers to here
CONTEXT = 8192  # tokens per request slot
SLOTS = 4  # concurrent requests a server may decode (refdec --max-concurrent, llama-server -np)
BUILD_DIR = Path.home() / ".cache" / "refdec" / "llama-server-build"
LLAMA_CPP_PYTHON = "0.3.36"


def choose_edits(count: int, least_chars: int = 1000, most_chars: int = 2200) -> list[dict]:
    """The first ``count`` edits (file order) whose original file has ``least_chars`` to
    ``most_chars`` characters (a plain decode of each takes about a minute here)."""
    rows = [row for row in data.edit_rows() if least_chars <= len(row["before"]) <= most_chars
            and row["before"] != row["after"]]
    if len(rows) < count:
        raise ValueError(f"only {len(rows)} edits of {least_chars}..{most_chars} characters")
    return rows[:count]


def llama_server_binary() -> Path:
    """llama-server from the llama.cpp that llama-cpp-python's sdist vendors, built once (~15
    minutes on 2 cores) into BUILD_DIR."""
    source = BUILD_DIR / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    binary = source / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    sdist = BUILD_DIR / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
    if not sdist.exists():
        # its source only (as refdec build-llama): "--no-binary :all:" would build its build tools from source too
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                        "-d", str(BUILD_DIR), f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=False)
        if not sdist.exists():
            raise FileNotFoundError(f"could not download the llama-cpp-python {LLAMA_CPP_PYTHON} sdist to {BUILD_DIR}")
    subprocess.run(["tar", "xzf", str(sdist), "-C", str(BUILD_DIR)], check=True)
    subprocess.run(["cmake", "-B", "build", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DCMAKE_BUILD_TYPE=Release"],
                   cwd=source, check=True)
    subprocess.run(["cmake", "--build", "build", "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
                   cwd=source, check=True)
    return binary


def server_command(name: str, model: Path, port: int, threads: int, prompt_cache: bool = False) -> list[str]:
    """The command that starts server ``name``; ``prompt_cache``: as a user runs it, reusing an
    earlier prompt's prefix (refdec-nocache never does), else every request prefilled from scratch."""
    if name.startswith("refdec"):
        cache = 4 if prompt_cache and name in ("refdec", "refdec-chunk128") else 0
        return [sys.executable, "-m", "refdec.cli", "serve", "--model", str(model), "--port", str(port),
                "--served-model-name", MODEL_ID, "--max-concurrent", str(SLOTS), "--ctx", str(CONTEXT),
                "--threads", str(threads), "--prefix-cache", str(cache)] + (
                    ["--no-implicit-reference"] if name == "refdec-noimplicit" else
                    ["--no-exact"] if name == "refdec-trees" else
                    ["--prefill-chunk", "128"] if name == "refdec-chunk128" else [])
    if name.startswith("lcp"):
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--port", str(port),
                   "--model_alias", MODEL_ID, "--n_ctx", str(CONTEXT), "--n_threads", str(threads),
                   "--n_threads_batch", str(threads)]
        return command + (["--draft_model", "prompt-lookup-decoding"] if name == "lcp-pld" else [])
    command = [str(llama_server_binary()), "-m", str(model), "--port", str(port), "-a", MODEL_ID,
               "-c", str(SLOTS * CONTEXT), "-np", str(SLOTS), "-t", str(threads), "-tb", str(threads)]
    if not prompt_cache:
        command.append("--no-cache-prompt")  # every server prefills each request: the edits repeat per client count
    return command + (["--spec-type", name.removeprefix("ls-")] if name != "ls" else [])


class Server:
    """A server process on 127.0.0.1:``port``, up until :meth:`stop`."""

    def __init__(self, name: str, command: list[str], port: int, log: Path) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + 900  # a first refdec serve may calibrate; a model may load slowly
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{name} exited ({self.process.returncode}); see {log}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{name} did not answer within 15 minutes; see {log}")
                time.sleep(1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def ask(client, row: dict, max_tokens: int, instruction: str | None = None, prediction: bool = True,
        user: str | None = None) -> dict:
    """One edit through ``client`` (``instruction``: instead of the row's commit message; ``prediction``:
    the file sent as ``prediction`` too, not only in the prompt; ``user``: the request's ``user``,
    refdec's memory tenant): its reply text, completion tokens, latency, prediction counts and cached
    prompt tokens."""
    from refdec.edit_prompt import chat_edit_messages

    messages, _ = chat_edit_messages(row["before"], instruction or row["message"])
    started = time.perf_counter()
    extra = {"prediction": {"type": "content", "content": row["before"]}} if prediction else None
    reply = client.chat.completions.create(model=MODEL_ID, messages=messages, temperature=0, max_tokens=max_tokens,
                                           extra_body=extra, **({"user": user} if user else {}))
    seconds = time.perf_counter() - started
    details = getattr(reply.usage, "completion_tokens_details", None)
    prompt_details = getattr(reply.usage, "prompt_tokens_details", None)
    return {"path": row["path"], "text": reply.choices[0].message.content or "", "seconds": seconds,
            "tokens": reply.usage.completion_tokens, "prompt_tokens": reply.usage.prompt_tokens,
            "finish": reply.choices[0].finish_reason,
            "accepted": getattr(details, "accepted_prediction_tokens", None),
            "rejected": getattr(details, "rejected_prediction_tokens", None),
            "cached": getattr(prompt_details, "cached_tokens", None)}


def follow_ups(url: str, rows: list[dict], max_tokens: int) -> list[dict]:
    """Each row's edit, then the follow-up edit of the same file, from one client: a pair each."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
    return [{"first": ask(client, row, max_tokens), "follow_up": ask(client, row, max_tokens, FOLLOW_UP)}
            for row in rows]


def follow_up_table(results: dict) -> str:
    """The markdown table of ``--follow-up``: per server, medians over the edits."""
    lines = ["| server | first request latency s (median) | follow-up latency s (median) | follow-up / first | "
             "follow-up prompt tokens cached | follow-up tokens/s (median) | × lcp (follow-up latency) |",
             "|---|---|---|---|---|---|---|"]
    base = results.get("lcp")
    for name, pairs in results.items():
        first = statistics.median(p["first"]["seconds"] for p in pairs)
        again = statistics.median(p["follow_up"]["seconds"] for p in pairs)
        cached = [p["follow_up"]["cached"] for p in pairs]
        shown = ("–" if any(c is None for c in cached) else
                 ", ".join(f"{c}/{p['follow_up']['prompt_tokens']}" for c, p in zip(cached, pairs)))
        rate = statistics.median(p["follow_up"]["tokens"] / p["follow_up"]["seconds"] for p in pairs)
        ratio = "-" if base is None else f"{statistics.median(p['follow_up']['seconds'] for p in base) / again:.2f}x"
        lines.append(f"| {name} | {first:.1f} | {again:.1f} | {again / first:.2f} | {shown} | {rate:.1f} | {ratio} |")
    return "\n".join(lines)


def run_clients(url: str, rows: list[dict], clients: int, max_tokens: int,
                prediction: bool = True) -> tuple[list[dict], float]:
    """Every row sent once by ``clients`` concurrent clients (``prediction``: as :func:`ask`); (the
    answers in row order, wall seconds). The requests of each client count are a ``user`` of their own:
    refdec's memory does not carry an edit's reply from one round to the same edit in the next."""
    import openai

    todo: queue.Queue = queue.Queue()
    for i, row in enumerate(rows):
        todo.put((i, row))
    answers: list = [None] * len(rows)
    errors: list = []

    def client_loop():
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
        while True:
            try:
                i, row = todo.get_nowait()
            except queue.Empty:
                return
            try:
                answers[i] = ask(client, row, max_tokens, prediction=prediction, user=f"clients-{clients}")
            except Exception as error:  # noqa: BLE001 - recorded and reported
                errors.append(f"{row['path']}: {error}")

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return answers, time.perf_counter() - started


def aider_command(aider: str, url: str, message: str, file: Path, edit_format: str) -> list[str]:
    """The aider run that edits ``file`` with ``message`` through the OpenAI server at ``url``."""
    return [aider, "--model", f"openai/{MODEL_ID}", "--openai-api-base", url + "/v1", "--openai-api-key", "none",
            "--edit-format", edit_format, "--no-git", "--yes-always", "--no-check-update", "--analytics-disable",
            "--no-show-model-warnings", "--no-pretty", "--map-tokens", "0", "--no-auto-lint",
            "--no-suggest-shell-commands", "--no-detect-urls", "--message", message, str(file)]


def aider_edit(aider: str, url: str, row: dict, edit_format: str, workdir: Path, timeout: float = 1800) -> dict:
    """One edit by aider (:func:`aider_command`) in a fresh ``workdir``: wall seconds, whether the
    file changed, the file after, aider's exit status and its output's tail."""
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "home").mkdir(parents=True)
    file = workdir / Path(row["path"]).name
    file.write_text(row["before"])
    env = {**os.environ, "HOME": str(workdir / "home"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    started = time.perf_counter()
    done = subprocess.run(aider_command(aider, url, row["message"], file, edit_format), cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    after = file.read_text()
    return {"path": row["path"], "format": edit_format, "seconds": seconds, "changed": after != row["before"],
            "text": after, "returncode": done.returncode, "output_tail": (done.stdout + done.stderr)[-2000:]}


def aider_table(runs: dict) -> str:
    """``--aider``'s table: per server and edit format, wall seconds and the ratio to lcp per edit."""
    lines = ["| server | edit format | edits | wall s (median) | × lcp per edit (median, least) | files changed | "
             "files = refdec's |", "|---|---|---|---|---|---|---|"]
    for (name, edit_format), edits in runs.items():
        base = runs.get(("lcp", edit_format))
        ratios = [b["seconds"] / e["seconds"] for e, b in zip(edits, base)] if base else []
        shown = f"{statistics.median(ratios):.2f}x, {min(ratios):.2f}x" if ratios else "-"
        ours = runs.get(("refdec", edit_format))
        same = "-" if ours is None else f"{sum(e['text'] == o['text'] for e, o in zip(edits, ours))}/{len(edits)}"
        wall = statistics.median(e["seconds"] for e in edits)
        changed = sum(e["changed"] for e in edits)
        lines.append(f"| {name} | {edit_format} | {len(edits)} | {wall:.1f} | {shown} | {changed}/{len(edits)} "
                     f"| {same} |")
    return "\n".join(lines)


def per_edit_ratios(answers_by: dict, clients: str = "1") -> dict:
    """Each server's tokens/s over lcp's, edit by edit, at ``clients`` (a list per server; none without lcp)."""
    base = answers_by.get("lcp", {}).get(clients)
    if base is None:
        return {}
    return {name: [round((a["tokens"] / a["seconds"]) / (b["tokens"] / b["seconds"]), 2) for a, b in zip(got, base)]
            for name, by_clients in answers_by.items() if (got := by_clients.get(clients)) is not None}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(answers: list[dict], wall: float) -> dict:
    rates = [a["tokens"] / a["seconds"] for a in answers]
    latencies = [a["seconds"] for a in answers]
    accepted = [a["accepted"] for a in answers if a["accepted"] is not None]
    return {"median_tokens_per_s": statistics.median(rates), "p50_latency": percentile(latencies, 0.5),
            "p95_latency": percentile(latencies, 0.95), "total_tokens_per_s": sum(a["tokens"] for a in answers) / wall,
            "tokens": sum(a["tokens"] for a in answers), "wall": wall,
            "accepted_fraction": sum(accepted) / sum(a["tokens"] for a in answers) if accepted else None}


def table(results: dict, clients: list[int]) -> str:
    """The markdown table: each server at each client count, with ratios to llama-cpp-python's plain server."""
    lines = ["| server | clients | median request tokens/s | p50 / p95 latency s | total tokens/s | vs lcp plain "
             "(median req, total) | accepted prediction | replies = refdec's |",
             "|---|---|---|---|---|---|---|---|"]
    for name, by_clients in results.items():
        for c in clients:
            row = by_clients.get(str(c))
            if row is None:
                continue
            base = results.get("lcp", {}).get(str(c))
            ratio = (f"{row['median_tokens_per_s'] / base['median_tokens_per_s']:.2f}x, "
                     f"{row['total_tokens_per_s'] / base['total_tokens_per_s']:.2f}x") if base else "-"
            accepted = "-" if row["accepted_fraction"] is None else f"{row['accepted_fraction']:.0%}"
            lines.append(f"| {name} | {c} | {row['median_tokens_per_s']:.1f} | {row['p50_latency']:.1f} / "
                         f"{row['p95_latency']:.1f} | {row['total_tokens_per_s']:.1f} | {ratio} | {accepted} | "
                         f"{row.get('same_as_refdec', '-')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--edits", type=int, default=4, help="edits of edits-click.jsonl sent (default 4)")
    parser.add_argument("--clients", default="1,2,4", help="concurrent clients, comma-separated (default 1,2,4)")
    parser.add_argument("--servers", default=",".join(SERVERS[:5]), help=f"of {', '.join(SERVERS)}")
    parser.add_argument("--model", default=None, help="a GGUF file (default: the editor model)")
    parser.add_argument("--threads", type=int, default=2, help="each server's CPU threads (default 2)")
    parser.add_argument("--max-tokens", type=int, default=1536, help="max_tokens of each request")
    parser.add_argument("--json", default=None, metavar="OUT", help="write every answer and summary here")
    parser.add_argument("--held-out", action="store_true",
                        help="the last --edits of the e2e benchmark's edits (1,000..5,000 characters; "
                             "benchmarks.e2e --held-out's, never tuned on), not the first of 1,000..2,200")
    parser.add_argument("--no-prediction", action="store_true",
                        help="send no `prediction`: the file only in the prompt, as most editing tools send it "
                             "(refdec-noimplicit: refdec serve --no-implicit-reference)")
    parser.add_argument("--aider", default=None, metavar="AIDER",
                        help="edit through aider (its executable, from a venv of its own) instead of the openai client")
    parser.add_argument("--edit-formats", default="whole,diff", help="--aider's edit formats (default whole,diff)")
    parser.add_argument("--follow-up", action="store_true",
                        help="each edit and then a second edit of the same file, the servers' prompt caches on")
    args = parser.parse_args(argv)
    servers = args.servers.split(",")
    unknown = [name for name in servers if name not in SERVERS]
    if unknown:
        parser.error(f"--servers: unknown {', '.join(unknown)} (known: {', '.join(SERVERS)})")
    clients = [int(c) for c in args.clients.split(",")]
    from refdec import gguf_files

    model = Path(args.model) if args.model else gguf_files.editor_model_gguf()
    *rows, warm_up = choose_edits(args.edits + 1)  # the warm-up edit is not measured: no server reuses its prefill
    if args.held_out:
        from benchmarks.workloads import editor_edit_rows

        rows = editor_edit_rows()[-args.edits:]
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / "refdec-serve-bench"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    results: dict = {}
    answers_by: dict = {}
    started: dict = {}
    try:
        cached = args.follow_up or bool(args.aider)  # a conversation: each server's prompt cache as users run it
        for k, name in enumerate(servers):  # all up at once, idle but the one a request is sent to
            print(f"[serve] {name}: starting", file=sys.stderr, flush=True)
            started[name] = Server(name, server_command(name, model, 8200 + k, args.threads, cached),
                                   8200 + k, logs / f"{name}.log")
            run_clients(started[name].url, [warm_up], 1, 8)  # warm-up: the weights' first touch, the first prefill
        if args.aider:
            aider_runs: dict = {}
            for edit_format in args.edit_formats.split(","):
                for row in rows:  # the servers take turns, edit by edit
                    for name in servers:
                        run = aider_edit(args.aider, started[name].url, row, edit_format, logs / "aider")
                        aider_runs.setdefault((name, edit_format), []).append(run)
                        print(f"[serve] aider {edit_format} {name} {row['path']}: {run['seconds']:.1f} s, changed "
                              f"{run['changed']}, exit {run['returncode']}", file=sys.stderr, flush=True)
        elif args.follow_up:
            results = {name: [] for name in servers}
            for row in rows:  # the servers take turns, edit by edit
                for name in servers:
                    results[name] += follow_ups(started[name].url, [row], args.max_tokens)
            for name, pairs in results.items():
                shown = [(p["first"]["seconds"], p["follow_up"]["seconds"], p["follow_up"]["cached"]) for p in pairs]
                print(f"[serve] {name} (first s, follow-up s, cached): {shown}", file=sys.stderr, flush=True)
        else:
            results, answers_by = {name: {} for name in servers}, {name: {} for name in servers}
            for c in clients:
                if c == 1:  # the servers take turns, edit by edit
                    got = {name: ([], 0.0) for name in servers}
                    for row in rows:
                        for name in servers:
                            answers, wall = run_clients(started[name].url, [row], 1, args.max_tokens,
                                                        not args.no_prediction)
                            got[name] = (got[name][0] + answers, got[name][1] + wall)
                else:  # the servers take turns, round by round (every edit, c clients at once)
                    got = {name: run_clients(started[name].url, rows, c, args.max_tokens, not args.no_prediction)
                           for name in servers}
                for name, (answers, wall) in got.items():
                    results[name][str(c)] = summarize(answers, wall)
                    answers_by[name][str(c)] = answers
                    print(f"[serve] {name} at {c} clients: {json.dumps(results[name][str(c)])}", file=sys.stderr,
                          flush=True)
    finally:
        for server in started.values():
            server.stop()
    if args.aider:
        print(f"edits: {', '.join(row['path'] for row in rows)}; model {model.name}; {args.threads} threads; aider")
        print(aider_table(aider_runs))
        if args.json:
            Path(args.json).write_text(json.dumps({"aider": [{"server": name, **run} for (name, _), runs in
                                                             aider_runs.items() for run in runs]}, indent=1))
        return 0
    if args.follow_up:
        print(f"edits: {', '.join(row['path'] for row in rows)}; model {model.name}; {args.threads} threads")
        print(follow_up_table(results))
        if args.json:
            Path(args.json).write_text(json.dumps({"follow_up": results}, indent=1))
        return 0
    reference = answers_by.get("refdec", {}).get(str(clients[0]))
    if reference is not None:
        for name, by_clients in answers_by.items():
            for c, answers in by_clients.items():
                same = sum(a["text"] == r["text"] for a, r in zip(answers, reference))
                results[name][c]["same_as_refdec"] = f"{same}/{len(answers)}"
    print(f"edits: {', '.join(row['path'] for row in rows)}; model {model.name}; {args.threads} threads")
    print(table(results, clients))
    ratios = per_edit_ratios(answers_by)
    if ratios:
        print("tokens/s over lcp's, edit by edit, at 1 client: "
              + "; ".join(f"{name} {r}" for name, r in ratios.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "answers": answers_by, "per_edit_ratios": ratios},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
