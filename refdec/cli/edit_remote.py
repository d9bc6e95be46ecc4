"""``refdec edit FILE --server URL``: the edit sent to a running OpenAI-compatible server.

The file and the instruction go as chat messages (refdec.edit_prompt.chat_edit_messages), the
file itself as the request's ``prediction`` (OpenAI's Predicted Outputs), greedy. A server that
drafts from the prediction (``refdec serve``, or vLLM with refdec's proposer) returns the
rewritten file many tokens per pass; many edits share one loaded model. The reply's code block
is the new file: written (``--out`` / ``--in-place``) only when the reply closed it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from refdec.atomic import atomic_write
from refdec.edit_prompt import chat_edit_messages, reply_code_block

__all__ = ["API_KEY_ENVS", "run"]

API_KEY_ENVS = ("REFDEC_API_KEY", "OPENAI_API_KEY")  # where the key comes from when --api-key is not given
LOCAL_ONLY = ("--compare", "--engine", "--threads", "--prompt-template")  # flags of the local decode


def _client(url: str, api_key: str | None):
    try:
        import openai
    except ImportError:
        raise ImportError("refdec edit --server needs the openai client: pip install 'refdec[serve]'") from None
    key = api_key or next((os.environ[name] for name in API_KEY_ENVS if os.environ.get(name)), None) or "none"
    base = url.rstrip("/")
    return openai, openai.OpenAI(base_url=base if base.endswith("/v1") else base + "/v1", api_key=key,
                                 max_retries=0, timeout=None)


def run(args, original: str, write_diff) -> int:
    """The edit of ``args.file`` (its text ``original``) by the server at ``args.server``;
    ``write_diff(original, result)`` prints ``--diff``."""
    given = [flag for flag in LOCAL_ONLY if getattr(args, flag[2:].replace("-", "_"), None)]
    if given:
        raise ValueError(f"{', '.join(given)}: a flag of the local decode; with --server the server decodes")
    openai, client = _client(args.server, args.api_key)
    messages, _fence = chat_edit_messages(original, args.instruction)
    settings = dict(temperature=0, extra_body={"prediction": {"type": "content", "content": original}})
    if args.max_new_tokens is not None:
        settings["max_tokens"] = args.max_new_tokens
    started = time.perf_counter()
    try:
        model = args.model or client.models.list().data[0].id
        reply = client.chat.completions.create(model=model, messages=messages, **settings)
    except openai.APIStatusError as error:
        body = error.body if isinstance(error.body, dict) else {}
        raise ValueError(f"--server {args.server} answered {error.status_code}: "
                         f"{body.get('message') or error.message}") from None
    except openai.APIConnectionError as error:
        raise OSError(f"--server {args.server}: {error}") from None
    seconds = time.perf_counter() - started
    text = reply.choices[0].message.content or ""
    result = reply_code_block(text)
    usage = reply.usage
    details = getattr(usage, "completion_tokens_details", None)
    accepted = getattr(details, "accepted_prediction_tokens", None)
    rejected = getattr(details, "rejected_prediction_tokens", None)
    print(f"[refdec edit] {usage.completion_tokens} tokens from {args.server} ({model}) in {seconds:.2f} s "
          f"({usage.completion_tokens / seconds if seconds > 0 else 0.0:.1f} tokens/s); prediction tokens accepted "
          f"{accepted}, rejected {rejected}; finish: {reply.choices[0].finish_reason}", file=sys.stderr)
    if result is None:
        what = f"the reply ({reply.choices[0].finish_reason}) holds no closed code block"
        if args.out is not None:
            print(f"[refdec edit] error: {what}; nothing was written and {args.file} is unchanged", file=sys.stderr)
            return 1
        print(f"[refdec edit] warning: {what}: the whole reply follows", file=sys.stderr)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 1
    if args.out is not None:
        atomic_write(Path(args.out), [result.encode("utf-8")])
    elif not args.diff:
        sys.stdout.write(result)
    if args.diff:
        write_diff(original, result)
    return 0
