"""Edit prompts: the original file and an instruction, framed so that a model
writes the whole updated file next and closes it with a code fence.

    prompt = build_edit_prompt(original, instruction, path="a.py")
    prompt.text          # the prompt text (tokenize with special tokens)
    prompt.stop          # the closing fence: a stop string for generation
    prompt.extract(out)  # the updated file: generated text up to the fence

Templates are ``str.format`` strings over ``{original}`` (ends with a newline),
``{instruction}``, ``{path}`` (" a.py" or "") and ``{fence}`` (a backtick run
longer than any inside the file, so the file cannot close it). A user template
(``--prompt-template F``) uses the same fields.

The default model (Gemma 3 270M) is a small base model, not an instruction
follower: the template decides whether it copies the file or paraphrases it.
Measured on four edits-click files (160 new tokens, greedy; character
similarity of the result to the updated file, and refdec tokens/pass):

    original-change  0.66 0.20 0.95 0.94   tokens/pass  7.0 10.7 20.1 20.4
    commit           0.44 0.04 0.88 0.88                6.7  6.4 15.6 15.8
    rewrite          0.63 0.01 0.88 0.88                7.0  5.7 15.6 15.8

so ``original-change`` (the simulator's edit prompt) is the default.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

__all__ = ["CHAT_TEMPLATE", "TEMPLATES", "DEFAULT_TEMPLATE", "EDITOR_SYSTEM_MESSAGE", "EditPrompt", "build_chat_edit_prompt",
           "build_edit_prompt", "chat_edit_messages", "fence_for", "reply_code_block"]

CHAT_TEMPLATE = "chat"  # the template name that asks for the model's own chat template (instruct models)

TEMPLATES = {
    # The benchmark workload's framing (benchmarks/workloads.py edit_prompt).
    "original-change": (
        "Original file{path}:\n{fence}\n{original}{fence}\n\n"
        "Change: {instruction}\n\n"
        "The same file{path} after the change:\n{fence}\n"
    ),
    # A commit: message first, then the file before and after.
    "commit": (
        "commit message: {instruction}\n\n"
        "--- before{path}\n{fence}\n{original}{fence}\n\n"
        "+++ after{path}\n{fence}\n"
    ),
    # An explicit instruction to copy the unchanged parts.
    "rewrite": (
        "Here is the file{path}:\n{fence}\n{original}{fence}\n\n"
        "Task: {instruction}\n"
        "Rewrite the complete file with this change applied. Copy every unchanged line exactly.\n\n"
        "Complete updated file{path}:\n{fence}\n"
    ),
}
DEFAULT_TEMPLATE = "original-change"


def fence_for(text: str) -> str:
    """A backtick fence longer than any backtick run in ``text`` (at least three)."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


@dataclass(frozen=True)
class EditPrompt:
    text: str   # the prompt
    stop: str   # stop string: the closing fence

    def extract(self, generated: str) -> str:
        """The updated file: ``generated`` up to the closing fence (all of it if the fence never came)."""
        cut = generated.find(self.stop)
        return generated if cut < 0 else generated[:cut]

    def complete(self, generated: str) -> bool:
        """``generated`` holds the closing fence: the file it gives is whole."""
        return self.stop in generated


def build_edit_prompt(original: str, instruction: str, *, path: str | None = None,
                      template: str | None = None) -> EditPrompt:
    """The prompt for rewriting ``original`` as ``instruction`` asks.

    ``template``: a name in TEMPLATES or a format string with the fields above
    (default ``DEFAULT_TEMPLATE``). Raises ValueError for an empty instruction,
    an unknown template name or a template without ``{original}``.
    """
    body = _file_body(original, instruction)
    if template is None:
        template = TEMPLATES[DEFAULT_TEMPLATE]
    elif template in TEMPLATES:
        template = TEMPLATES[template]
    elif "{original}" not in template:
        raise ValueError(f"template must be one of {sorted(TEMPLATES)} or a format string with {{original}}, "
                         f"got {template[:60]!r}")
    _check_fields(template)
    fence = fence_for(original + instruction)
    text = template.format(original=body, instruction=instruction.strip(), path=f" {path}" if path else "",
                           fence=fence)
    return EditPrompt(text=text, stop=fence)


def _file_body(original: str, instruction: str) -> str:
    """``original`` ending with a newline (as the prompts show it), once ``instruction`` is checked:
    ValueError for an empty one."""
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError(f"instruction must be a non-empty string, got {instruction!r}")
    return original if original.endswith("\n") or not original else original + "\n"


_FIELDS = ("original", "instruction", "path", "fence")


def _check_fields(template: str) -> None:
    """Every replacement field of ``template`` is one of _FIELDS, plain (no attribute, index,
    conversion or format spec); ValueError naming the first that is not."""
    try:
        fields = [(name, conversion, spec) for _, name, spec, conversion in string.Formatter().parse(template)
                  if name is not None]
    except ValueError as exc:  # e.g. "Single '}' encountered in format string"
        raise ValueError(f"template is not a valid format string ({exc}); write {{{{ and }}}} for literal "
                         f"braces") from None
    for name, conversion, spec in fields:
        if name not in _FIELDS or conversion or spec:
            shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"template field {shown} is not one of {{original}}, {{instruction}}, {{path}}, "
                             f"{{fence}} (write {{{{ and }}}} for literal braces)")


EDITOR_SYSTEM_MESSAGE = ("You are a code editor. Apply the requested change to the file and copy every other line "
                         "exactly as it is, including comments, docstrings and blank lines.")


def _chat_text(tokenizer, messages: list[dict]) -> str:
    """``messages`` through ``tokenizer``'s chat template, the assistant's turn opened; ValueError
    naming --prompt-template chat when the tokenizer has no template."""
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except ValueError as exc:  # no chat template at all
        raise ValueError(f"--prompt-template {CHAT_TEMPLATE}: the model has no chat template ({exc})") from exc


def chat_edit_messages(original: str, instruction: str) -> tuple[list[dict], str]:
    """``(messages, fence)``: the edit as chat messages (a system message asking for an exact copy
    apart from the change, :data:`EDITOR_SYSTEM_MESSAGE`; the user message: the file fenced, the
    instruction, the whole file asked for in one block) and the fence around the file."""
    body = _file_body(original, instruction)
    fence = fence_for(original + instruction)
    message = (f"{fence}\n{body}{fence}\n\n{instruction.strip()}\n\n"
               f"Reply with the whole updated file in one code block.")
    return [{"role": "system", "content": EDITOR_SYSTEM_MESSAGE}, {"role": "user", "content": message}], fence


def reply_code_block(reply: str) -> str | None:
    """The file in a chat reply: the body of its first fenced code block (```` ```lang ```` ...
    the same fence), None when the reply closes no code block."""
    match = re.search(r"^(`{3,})[^\n`]*\n(.*?)^\1[ \t]*$", reply, re.S | re.M)
    return None if match is None else match.group(2)


def build_chat_edit_prompt(original: str, instruction: str, tokenizer) -> EditPrompt:
    """The edit through ``tokenizer.apply_chat_template``: a system message asking for an exact copy
    apart from the change (:data:`EDITOR_SYSTEM_MESSAGE`; folded into the user message for a
    template without a system role), the user message (the file fenced, the instruction, the
    whole file asked for in one block), and the reply begun with the fence, so that the model
    writes the file next and closes it with the fence, as with the base-model templates (the
    text is tokenized without adding special tokens: the template wrote them). ValueError when the
    tokenizer has no chat template or ``instruction`` is empty."""
    messages, fence = chat_edit_messages(original, instruction)
    try:
        text = _chat_text(tokenizer, messages)
    except ValueError:
        raise
    except Exception:  # noqa: BLE001 - a template that refuses a system role (jinja2's TemplateError)
        folded = f"{EDITOR_SYSTEM_MESSAGE}\n\n{messages[1]['content']}"
        text = _chat_text(tokenizer, [{"role": "user", "content": folded}])
    return EditPrompt(text=f"{text}{fence}\n", stop=fence)
