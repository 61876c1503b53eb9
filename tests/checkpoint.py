"""A small Qwen3 checkpoint directory laid out the way a downloaded one is: ``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json`` and ``tokenizer_config.json``
with its own full Qwen3-format chat template (tools block, ``tool_calls``, grouped tool responses,
``<think>`` blocks after the last query, ``enable_thinking``). Built offline from a config, never a hub.

The template is written here from the Qwen3 format's rules, not copied from a model repository; what
matters for the pipeline is what a real one does that ``QWEN3_LITE_TEMPLATE`` does not: the last
assistant turn gets an (empty) ``<think>`` block that the same turn loses once it is history, so a
re-rendered conversation is not a prefix-extension of the previous one.
"""

from __future__ import annotations

import copy
from pathlib import Path

from lopd.config import ModelParams
from lopd.policy.modeling import build_tiny_qwen3

QWEN3_FULL_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' and not (m.content is string and m.content.startswith('<tool_response>')) %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set content = m.content if m.content is string else '' %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- endif %}"
    "{%- for tc in (m.tool_calls or []) %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    "{{- ('\\n' if content or not loop.first else '') + '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def build_qwen3_checkpoint(path: Path, tokenizer, seed: int = 0) -> Path:
    """Write a random tiny Qwen3 with a copy of ``tokenizer`` (its template replaced by the full one) to ``path``."""
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN3_FULL_TEMPLATE
    p = ModelParams(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64)
    model = build_tiny_qwen3(p, tok, seed=seed)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path
