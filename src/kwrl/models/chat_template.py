"""The chat format of kwrl's tiny model: Qwen3's ChatML with tools, made prefix-stable.

The template is Qwen3's, with the two changes that TITO needs (REFERENCE.md section 3):

- Earlier `<think>` blocks are kept. Assistant content is rendered verbatim, so a turn that was
  sampled with its reasoning re-renders with it; Qwen3's stock template strips the reasoning of
  turns before the last user query, which makes a from-scratch render drift from the tape.
- Each tool result is its own `user` turn (`<|im_start|>user\\n<tool_response>\\n...\\n
  </tool_response><|im_end|>\\n`). Qwen3 merges consecutive tool results into one user turn, so
  adding a result rewrites the end of the previous one; here rendering a conversation plus one
  message only ever appends text. For a single tool call per step the two formats are identical.

Everything else is Qwen3's, byte for byte: tool schemas as JSON lines inside `<tools></tools>` in
the system turn, assistant calls as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>`, `reasoning_content` rendered as a `<think>` block, `add_generation_prompt` ->
`<|im_start|>assistant\\n` (plus an empty think block when `enable_thinking=False`).
"""

from __future__ import annotations

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
"""Control tokens: never produced from plain text, dropped by `skip_special_tokens`."""
TAG_TOKENS = (
    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
"""Added (non-special) tokens, as in Qwen3: one id each, kept when decoding."""

CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if message.reasoning_content is string and message.reasoning_content %}
            {{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}
            {%- set content = content.lstrip('\\n') %}
        {%- endif %}
        {{- content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + content }}
        {{- '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""
