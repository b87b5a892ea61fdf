"""A generation request's fields, read and checked: `/v1/completions` and `/v1/chat/completions`
bodies become a `GenRequest`. Every field a client may send is listed here; any other field is a
400 naming it (never silently dropped). Fields clients send by habit are accepted at their no-op
value only (`presence_penalty: 0`, `echo: false`, ...)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from engine.server.errors import BadRequest, model_not_found
from engine.server.fields import (INT64, check_neutral, get_bool, get_enum, get_float, get_int, get_stop, get_str,
                     get_token_ids)

MAX_CHOICES = 64  # prompts x n in one request
MAX_LOGPROBS = 20
CHARS_PER_TOKEN = 64  # a text longer than max_model_len x this cannot be a prompt that fits
PRIORITIES = ("foreground", "background")
ROLES = ("system", "developer", "user", "assistant")

COMMON = {"model", "max_tokens", "max_completion_tokens", "stream", "stream_options", "temperature", "top_p",
          "top_k", "seed", "n", "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
          "priority", "draft", "user", "request_id", "return_token_ids", "return_tokens_as_token_ids",
          "logprobs"}
# accepted at their no-op value only
NEUTRAL = {"presence_penalty": (0.0,), "frequency_penalty": (0.0,), "repetition_penalty": (1.0,),
           "min_p": (0.0,), "min_tokens": (0,), "logit_bias": ({},), "use_beam_search": (False,),
           "length_penalty": (1.0,), "echo": (False,), "response_format": ({"type": "text"},),
           "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,)}
COMPLETION = COMMON | {"prompt", "suffix", "best_of", "add_special_tokens"}
CHAT = COMMON | {"messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
                 "add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                 "include_reasoning", "store", "metadata"}
CHAT_NEUTRAL = {"add_special_tokens": (False,), "tools": ([],), "tool_choice": ("none", "auto"), "add_generation_prompt": (True,),
                "continue_final_message": (False,), "chat_template_kwargs": ({},), "store": (False,)}


@dataclass
class GenRequest:
    chat: bool
    prompts: list[list[int]]
    n: int
    max_tokens: int | None  # None: the rest of the context (chat without a limit, as vLLM)
    stream: bool
    include_usage: bool
    continuous_usage: bool  # usage (so far) on every chunk too: vLLM's continuous_usage_stats
    temperature: float
    top_p: float
    top_k: int
    seed: int | None  # the reply's seed (drawn when sampling without one); choice i uses seed + i
    logprobs: int | None  # top-k alternatives per token; None: no logprobs
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str: bool = False
    ignore_eos: bool = False
    background: bool = False
    draft: bool = True
    tokens_as_ids: bool = False

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    def choice_seed(self, i: int) -> int | None:
        if self.seed is None:
            return None
        return (self.seed + i - INT64[0]) % 2 ** 64 + INT64[0]  # wraps inside int64


def check_model(body: dict, names: tuple[str, ...]) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    if model not in names:
        raise model_not_found(model[:200])


def check_fields(body: dict, allowed: set[str], neutral: dict) -> None:
    for key in body:
        if key in neutral:
            check_neutral(body, key, neutral[key])
        elif key not in allowed:
            raise BadRequest(f"'{key[:100]}' is not a field this server implements", key[:100])


def parse_common(body: dict, chat: bool, prompts: list[list[int]], model) -> GenRequest:
    """The fields both endpoints share; `prompts` are already token ids."""
    n = get_int(body, "n", 1, 1, MAX_CHOICES)
    if chat:
        best_of = None
    else:
        best_of = get_int(body, "best_of", None, 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise BadRequest("'best_of' is not implemented by this server: only best_of = n is accepted", "best_of")
    if len(prompts) * n > MAX_CHOICES:
        raise BadRequest(f"{len(prompts)} prompts x n = {n} is more than {MAX_CHOICES} choices", "n")
    defaults = model.defaults  # the checkpoint's generation_config.json, for fields left out
    max_tokens = get_int(body, "max_completion_tokens", None, 1)
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", defaults.get("max_tokens", None if chat else 16), 1)
    limit = model.max_model_len
    for p in prompts:
        need = len(p) + (max_tokens or 1)
        if need > limit:
            raise BadRequest(f"this model's maximum context length is {limit} tokens; the request asks for "
                             f"{need} ({len(p)} in the prompt, {max_tokens or 1} in the completion)", "max_tokens")
    opts = body.get("stream_options")
    stream = get_bool(body, "stream", False)
    include_usage = continuous = False
    if opts is not None:
        if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
            raise BadRequest("'stream_options' must be an object with 'include_usage'", "stream_options")
        if not stream:
            raise BadRequest("'stream_options' is only allowed with 'stream': true", "stream_options")
        include_usage = get_bool(opts, "include_usage", False)
        continuous = get_bool(opts, "continuous_usage_stats", False) and include_usage  # as vLLM
    temperature = get_float(body, "temperature", defaults.get("temperature", 0.0), 0.0, 100.0)
    seed = get_int(body, "seed", None, *INT64)
    if seed is None and temperature > 0:
        seed = secrets.randbelow(2 ** 63)  # reported with the reply, so it can be replayed
    if chat:
        want = get_bool(body, "logprobs", False)
        top = get_int(body, "top_logprobs", None, 0, MAX_LOGPROBS)
        if top is not None and not want:
            raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        logprobs = (top or 0) if want else None
    else:
        logprobs = get_int(body, "logprobs", None, 0, MAX_LOGPROBS)
    for name in ("user", "request_id"):
        get_str(body, name)
    for name in ("return_token_ids", "parallel_tool_calls", "include_reasoning"):
        get_bool(body, name, True)
    metadata = body.get("metadata")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise BadRequest("'metadata' must be an object of strings", "metadata")
    return GenRequest(
        chat=chat, prompts=prompts, n=n, max_tokens=max_tokens, stream=stream, include_usage=include_usage,
        continuous_usage=continuous,
        temperature=temperature, top_p=get_float(body, "top_p", defaults.get("top_p", 1.0), 0.0, 1.0, lo_open=True),
        top_k=max(0, get_int(body, "top_k", defaults.get("top_k", 0), -1, model.vocab_size)), seed=seed, logprobs=logprobs,
        stop=get_stop(body), stop_token_ids=get_token_ids(body, "stop_token_ids", model.vocab_size),
        include_stop_str=get_bool(body, "include_stop_str_in_output", False),
        ignore_eos=get_bool(body, "ignore_eos", False),
        background=get_enum(body, "priority", PRIORITIES, "foreground") == "background",
        draft=get_bool(body, "draft", True), tokens_as_ids=get_bool(body, "return_tokens_as_token_ids", False))


def parse_completion(body: object, model) -> GenRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    check_model(body, model.names)
    check_fields(body, COMPLETION, NEUTRAL)
    check_neutral(body, "suffix", ("",))
    special = get_bool(body, "add_special_tokens", True)
    return parse_common(body, False, completion_prompts(body.get("prompt"), model, special), model)


def completion_prompts(raw: object, model, special: bool = True) -> list[list[int]]:
    """A string, a list of ids, or a list of either: one prompt each."""
    if raw is None:
        raise BadRequest("'prompt' is required", "prompt")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(_is_id(t) for t in raw)):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'prompt' must be a string, a list of token ids, or a non-empty list of either", "prompt")
    if len(raw) > MAX_CHOICES:
        raise BadRequest(f"at most {MAX_CHOICES} prompts in one request", "prompt")
    out = []
    for i, p in enumerate(raw):
        where = "prompt" if len(raw) == 1 else f"prompt[{i}]"
        if isinstance(p, str):
            ids = encode(model, p, where, special)
        elif isinstance(p, list) and all(_is_id(t) for t in p):
            ids = p
            bad = next((t for t in ids if not 0 <= t < model.vocab_size), None)
            if bad is not None:
                raise BadRequest(f"token id {bad} in {where} is outside the vocabulary (0..{model.vocab_size - 1})",
                                 "prompt")
        else:
            raise BadRequest(f"'{where}' must be a string or a list of token ids", "prompt")
        if not ids:
            raise BadRequest(f"the prompt is empty ({where})", "prompt")
        out.append(list(ids))
    return out


def _is_id(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def encode(model, text: str, where: str, special: bool = True) -> list[int]:
    """A text prompt's ids, the tokenizer's special tokens added unless `add_special_tokens: false`
    (as transformers and vLLM encode completions prompts)."""
    if len(text) > model.max_model_len * CHARS_PER_TOKEN:
        raise BadRequest(f"{where} is {len(text)} characters: far longer than this model's context of "
                         f"{model.max_model_len} tokens", "prompt")
    return list(model.tokenizer.encode(text, add_special_tokens=special))


def parse_chat(body: object, model) -> GenRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    check_model(body, model.names)
    check_fields(body, CHAT, {**NEUTRAL, **CHAT_NEUTRAL})
    messages = chat_messages(body.get("messages"))
    total = sum(len(m["content"]) for m in messages)
    if total > model.max_model_len * CHARS_PER_TOKEN:
        raise BadRequest(f"the messages are {total} characters: far longer than this model's context", "messages")
    return parse_common(body, True, [chat_prompt(model, messages)], model)


def chat_prompt(model, messages: list[dict]) -> list[int]:
    try:
        return list(model.tokenizer.chat_prompt(messages))
    except Exception as exc:  # noqa: BLE001 - a template's own refusals (no template, roles must alternate, ...)
        raise BadRequest(f"the chat template cannot render these messages: {exc}"[:500], "messages") from None


def chat_messages(raw: object) -> list[dict]:
    """[{role, content}] with content a string (a list of text parts is joined, as vLLM does)."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"'{where}' must be an object with 'role' and 'content'", "messages")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise BadRequest(f"'{where}.{sorted(extra)[0][:100]}' is not a field this server implements", "messages")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(f"'{where}.role' must be one of {', '.join(ROLES)}", "messages")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise BadRequest(f"'{where}.name' must be a string", "messages")
        out.append({"role": role, "content": _content(m.get("content"), where, role)})
    return out


def _content(content: object, where: str, role: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                    and set(part) <= {"type", "text"}):
                raise BadRequest(f"'{where}.content[{j}]' must be a text part {{\"type\": \"text\", \"text\": ...}}: "
                                 f"only text is served", "messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise BadRequest(f"'{where}.content' must be a string or a list of text parts", "messages")
