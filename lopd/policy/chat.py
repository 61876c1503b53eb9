"""Chat format: how a conversation becomes tokens, the same for the tiny model and a real Qwen3.

The rollout engine never re-renders a whole conversation: token ids are append-only, so the
ids the student generated are exactly the ids later scored. ``ChatFormat`` derives the three
pieces of text it needs (the generation prompt, what follows an assistant's end-of-turn token,
and how a tool response is framed) from the tokenizer's own chat template, so any checkpoint
with a Qwen3/Hermes-style template works through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL_TAGS = ("<tool_call>", "</tool_call>")
TOOL_RESPONSE_TAGS = ("<tool_response>", "</tool_response>")
THINK_TAGS = ("<think>", "</think>")
LATENT_PH = "<|LATENT_PH|>"

# A Qwen3-style template (tool results come back as a user turn wrapped in <tool_response>),
# reduced to what ToolWorld needs. Real Qwen3 tokenizers ship their own, richer one.
QWEN3_LITE_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_MARK = "\u2063LOPD_MARK\u2063"  # an action text no template will contain
_OBS = "\u2063LOPD_OBS\u2063"  # an observation text, likewise


@dataclass(frozen=True)
class ChatFormat:
    """Text pieces for append-only multi-turn tokenisation.

    ``after_eos``: text the template puts after an assistant's ``<|im_end|>`` (Qwen3: ``"\\n"``).
    ``tool_prefix`` / ``tool_suffix``: what frames a tool result, generation prompt included.
    ``user_prefix`` / ``user_suffix``: the same for a new user message (multi-turn benchmarks such as BFCL).
    """

    after_eos: str
    tool_prefix: str
    tool_suffix: str
    eos_token: str
    user_prefix: str
    user_suffix: str

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "ChatFormat":
        """Read the pieces off the template: what follows an assistant action's eos in a rendered conversation.

        Only the text *after* the action is used. A real Qwen3 template renders the last assistant
        turn with an empty ``<think>`` block that the same turn loses once it is history, so a
        re-rendered conversation is not an extension of the previous rendering; the rollout never
        re-renders (its token ids are what the policy saw), it only needs these appended pieces.
        """
        base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        with_action = base + [{"role": "assistant", "content": _MARK}]
        render = lambda msgs, gen: tokenizer.apply_chat_template(  # noqa: E731
            msgs, tokenize=False, add_generation_prompt=gen, **_template_kwargs(tokenizer)
        )
        eos = tokenizer.eos_token or IM_END
        _, _, tail = render(with_action, False).partition(_MARK)
        if not tail.startswith(eos):
            raise ValueError(f"chat template does not end assistant turns with the eos token {eos!r}")
        after_eos = tail[len(eos):]
        gen_prompt = render(base, True)[len(render(base, False)):]  # e.g. "<|im_start|>assistant\n" (+ empty think block)

        def framing(role: str) -> tuple[str, str]:
            _, _, rest = render(with_action + [{"role": role, "content": _OBS}], True).partition(_MARK + eos)
            if not rest.startswith(after_eos) or _OBS not in rest:
                raise ValueError(f"chat template renders a {role} turn after an assistant turn in a way multi-turn rollouts cannot append")
            prefix, _, suffix = rest[len(after_eos):].partition(_OBS)
            if not suffix.endswith(gen_prompt):
                raise ValueError(f"chat template's generation prompt after a {role} turn differs from the first one ({gen_prompt!r})")
            return prefix, suffix

        (tool_prefix, tool_suffix), (user_prefix, user_suffix) = framing("tool"), framing("user")
        return cls(after_eos=after_eos, tool_prefix=tool_prefix, tool_suffix=tool_suffix, eos_token=eos,
                   user_prefix=user_prefix, user_suffix=user_suffix)

    def observation_chunk(self, observation: str, closed: bool, role: str = "tool") -> str:
        """Text appended after an assistant action: a tool response (or, ``role="user"``, the user's
        next message) + the next generation prompt.

        ``closed``: whether the action already ended with the eos token (else it was cut at
        ``max_new_tokens`` and we close the turn ourselves).
        """
        close = "" if closed else self.eos_token
        prefix, suffix = (self.user_prefix, self.user_suffix) if role == "user" else (self.tool_prefix, self.tool_suffix)
        return f"{close}{self.after_eos}{prefix}{observation}{suffix}"


def _template_kwargs(tokenizer) -> dict:
    # Qwen3 templates take enable_thinking; agents here act without a thinking block.
    tmpl = getattr(tokenizer, "chat_template", "") or ""
    return {"enable_thinking": False} if "enable_thinking" in tmpl else {}


def render_prompt(tokenizer, messages: list[dict]) -> str:
    """Initial prompt text: the conversation so far plus the assistant generation prompt."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **_template_kwargs(tokenizer))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]
