"""Tape vs from-scratch render: zero drift for our template, and the known traps, on literal ids."""

from __future__ import annotations

import copy
import json

import pytest
from transformers import PreTrainedTokenizerFast

from kwrl.models import build_tokenizer
from kwrl.models.corpus import EXAMPLE_TOOLS, sample_corpus
from kwrl.render import (
    ChatTemplateRenderer,
    Renderer,
    Tape,
    TemplateError,
    drift,
    observation_messages,
)
from kwrl.types import Message, ToolResult

IM_START, IM_END, THINK = 1, 2, 7

# Qwen3's stock chat template (Qwen/Qwen3-8B), as shipped: it strips the reasoning of assistant
# turns before the last user query and merges consecutive tool results into one user turn.
QWEN3_STOCK_TEMPLATE = """\
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
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and \
message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = \
content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + \
reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
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
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

# A realistic episode: reasoning, a call with nested JSON (numbers, null, booleans, unicode),
# two calls in one turn, multi-line results, and a final answer with reasoning.
TURNS = (
    '<think>\nThe segment table is in the finance workbook.\n</think>\n\n<tool_call>\n'
    '{"name": "search_file", "arguments": {"path": "Finance/Model 2025.xlsx", "query": "Cloud"}}'
    "\n</tool_call>",
    'Two more checks.\n<tool_call>\n{"name": "sheets_edit", "arguments": {"path": '
    '"Finance/Budget.xlsx", "edits": [{"cell": "B7", "value": 4512.5, "formula": null}], '
    '"recalc": true, "note": "Café – Zürich €"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "read_file", "arguments": {"path": "Mail/inbox.mbox"}}\n</tool_call>',
    "<think>\nBoth agree.\n</think>\n\nCloud revenue in Q3 2025 was $529.2m (B7 updated).",
)
RESULTS = (
    ("Cloud | 529.2 | 81.8\nCloud (draft) | 498.0 | 70.1",),
    ("Updated B7.", "From: cfo@harlow.example\nSubject: Q3\n\nFinal figures attached."),
)


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return build_tokenizer(sample_corpus(), vocab_size=512)


@pytest.fixture(scope="module")
def renderer(tok: PreTrainedTokenizerFast) -> ChatTemplateRenderer:
    return ChatTemplateRenderer(tok)


def ids(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def run_episode(renderer: Renderer, sampled_turns: list[list[int]],
                results: tuple[tuple[str, ...], ...] = RESULTS,
                follow_up: dict[int, str] | None = None, allow_errors: bool = False,
                ) -> tuple[Tape, list[Message]]:
    """What a harness does: sample, parse, run tools, append observations; never re-render."""
    messages = [Message("system", "You are an analyst."),
                Message("user", "What was Cloud revenue in Q3 2025?")]
    tape = Tape()
    tape.prompt(renderer.initial_prompt(messages, EXAMPLE_TOOLS))
    for k, sampled in enumerate(sampled_turns):
        tape.append_sampled(sampled, [-0.1] * len(sampled), policy_version=k,
                            finish_reason="stop")
        parsed = renderer.parse_assistant(sampled, call_id_prefix=f"t{k}")
        assert parsed.ok or allow_errors, parsed.errors
        messages.append(parsed.message)
        calls = parsed.message.tool_calls
        observed: list[ToolResult | Message] = [
            ToolResult(call.id, content)
            for call, content in zip(calls, results[k] if calls else (), strict=True)]
        if not parsed.ok:
            observed.append(Message("tool", parsed.error_message()))
        if follow_up and k in follow_up:
            observed.append(Message("user", follow_up[k]))
        if observed:
            tape.append_observation(renderer.observation(observed))
            messages += observation_messages(observed)
    return tape, messages


def sampled(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    """A turn as if the model sampled the canonical tokenization of `text`, then <|im_end|>."""
    return ids(tok, text) + [IM_END]


def test_a_realistic_episode_has_zero_drift(tok: PreTrainedTokenizerFast,
                                            renderer: ChatTemplateRenderer) -> None:
    tape, messages = run_episode(renderer, [sampled(tok, t) for t in TURNS])
    assert drift(tape, renderer, messages, EXAMPLE_TOOLS).ok
    rendered = renderer.render(messages, EXAMPLE_TOOLS)
    # Token for token: the only extra in a render is the `\n` the template puts after the last
    # <|im_end|>, which the model never sampled.
    assert rendered[: len(tape)] == list(tape.token_ids)
    assert rendered[len(tape):] == ids(tok, "\n")
    assert messages[4].tool_calls[0].arguments["edits"][0] == {
        "cell": "B7", "value": 4512.5, "formula": None}


def test_the_loss_mask_covers_exactly_the_sampled_tokens(tok: PreTrainedTokenizerFast,
                                                         renderer: ChatTemplateRenderer) -> None:
    turns = [sampled(tok, t) for t in TURNS]
    tape, _ = run_episode(renderer, turns)
    assert sum(tape.loss_mask) == sum(len(t) for t in turns)
    for k, turn in enumerate(tape.turns):
        assert list(tape.sampled(k)) == turns[k]
        assert tape.loss_mask[turn.start: turn.end] == (1,) * len(turns[k])
        assert tape.policy_versions[turn.start: turn.end] == (k,) * len(turns[k])
        assert tape.token_ids[turn.end - 1] == IM_END
    assert all(m == 0 for m, v in zip(tape.loss_mask, tape.policy_versions, strict=True)
               if v == -1)


def test_dropping_the_newline_after_im_end_is_one_drifted_token_at_the_turn_boundary(
    tok: PreTrainedTokenizerFast, renderer: ChatTemplateRenderer
) -> None:
    class NoNewline(ChatTemplateRenderer):
        """The classic bug: observations rendered on their own, without the base's `\\n`."""

        def observation(self, results, nudge=None, *, closed=True):  # type: ignore[no-untyped-def]
            return super().observation(results, nudge, closed=closed)[1:]

    buggy = NoNewline(tok)
    tape, messages = run_episode(buggy, [sampled(tok, TURNS[0]), sampled(tok, "Done.")])
    report = drift(tape, renderer, messages, EXAMPLE_TOOLS)
    boundary = tape.turns[0].end
    assert (report.drift_tokens, report.first_mismatch) == (1, boundary)
    assert tape.token_ids[boundary - 1: boundary + 1] == (IM_END, IM_START)
    rendered = renderer.render(messages, EXAMPLE_TOOLS)
    assert rendered[boundary - 1: boundary + 1] == [IM_END, *ids(tok, "\n")]
    assert "<|im_end|><|im_start|>user" in report.tape_context
    assert "<|im_end|>\n<|im_start|>user" in report.render_context


@pytest.mark.parametrize(
    "call",
    [
        '{"name": "read_file", "arguments": {"path":"a.xlsx","sheet":"Revenue"}}',
        '{"arguments": {"path": "a.xlsx", "sheet": "Revenue"}, "name": "read_file"}',
        '{"name": "read_file", "arguments": {"path": "a.xlsx", "sheet": "Rev\\u00e9nue"}}',
        '{"name": "read_file", "arguments": {"path": "a.xlsx", "rows": 1e3}}',
    ],
    ids=["spacing", "top-level key order", "unicode escape", "exponent"],
)
def test_re_serialized_tool_call_json_drifts_but_the_tape_keeps_what_was_sampled(
    tok: PreTrainedTokenizerFast, renderer: ChatTemplateRenderer, call: str
) -> None:
    turn = sampled(tok, f"<tool_call>\n{call}\n</tool_call>")
    tape, messages = run_episode(renderer, [turn, sampled(tok, "Done.")],
                                 results=(("Revenue | 4,512",),))
    assert list(tape.sampled(0)) == turn  # trained on exactly the sampled ids
    report = drift(tape, renderer, messages, EXAMPLE_TOOLS)
    assert not report.ok
    assert tape.turns[0].start < report.first_mismatch < tape.turns[0].end
    # The render holds json.dumps of the parsed arguments, not what the model wrote.
    text = renderer.render_text(messages, EXAMPLE_TOOLS)
    arguments = json.dumps(dict(messages[2].tool_calls[0].arguments), ensure_ascii=False)
    assert f'{{"name": "read_file", "arguments": {arguments}}}' in text
    assert call not in text


def test_a_malformed_call_stays_verbatim_text_so_it_does_not_drift(
    tok: PreTrainedTokenizerFast, renderer: ChatTemplateRenderer
) -> None:
    call = '{"name": "read_file", "arguments": {"path": "a.xlsx", "raw": True}}'
    turn = sampled(tok, f"Reading.\n<tool_call>\n{call}\n</tool_call>")
    tape, messages = run_episode(renderer, [turn, sampled(tok, "Done.")], allow_errors=True)
    assert messages[2].tool_calls == () and call in messages[2].content
    assert "not valid JSON" in messages[3].content  # the repair went back as a tool message
    assert drift(tape, renderer, messages, EXAMPLE_TOOLS).ok


def test_argument_key_order_survives_parsing_so_it_does_not_drift(
    tok: PreTrainedTokenizerFast, renderer: ChatTemplateRenderer
) -> None:
    call = '{"name": "read_file", "arguments": {"sheet": "Revenue", "path": "a.xlsx"}}'
    turn = sampled(tok, f"<tool_call>\n{call}\n</tool_call>")
    tape, messages = run_episode(renderer, [turn, sampled(tok, "Done.")],
                                 results=(("Revenue | 4,512",),))
    assert list(messages[2].tool_calls[0].arguments) == ["sheet", "path"]
    assert drift(tape, renderer, messages, EXAMPLE_TOOLS).ok


def test_a_non_canonical_tokenization_of_the_same_text_drifts(tok: PreTrainedTokenizerFast,
                                                              renderer: ChatTemplateRenderer
                                                              ) -> None:
    word = ids(tok, "Revenue")
    spelled_word = [i for ch in "Revenue" for i in ids(tok, ch)]
    assert len(word) < len(spelled_word)
    canonical = sampled(tok, "Revenue was $529.2m.")
    spelled = spelled_word + canonical[len(word):]
    assert renderer.decode(spelled) == renderer.decode(canonical)  # same text, other ids
    tape, messages = run_episode(renderer, [spelled])
    report = drift(tape, renderer, messages, EXAMPLE_TOOLS)
    assert report.drift_tokens == len(spelled_word)
    assert report.first_mismatch == tape.turns[0].start


def stock_qwen3(tok: PreTrainedTokenizerFast) -> ChatTemplateRenderer:
    stock_tok = copy.deepcopy(tok)
    stock_tok.chat_template = QWEN3_STOCK_TEMPLATE
    return ChatTemplateRenderer(stock_tok)


def test_our_template_keeps_earlier_reasoning_where_qwen3_stock_drops_it(
    tok: PreTrainedTokenizerFast, renderer: ChatTemplateRenderer
) -> None:
    turns = [sampled(tok, TURNS[0]), sampled(tok, "<think>\nFound.\n</think>\n\n$529.2m."),
             sampled(tok, "<think>\nSame table.\n</think>\n\n$81.8m.")]
    follow_up = {1: "And its EBITDA?"}  # a new user query: stock Qwen3 now strips turns 1 and 2
    tape, messages = run_episode(renderer, turns, results=RESULTS[:1], follow_up=follow_up)
    assert drift(tape, renderer, messages, EXAMPLE_TOOLS).ok
    stock = stock_qwen3(tok)
    report = drift(tape, stock, messages, EXAMPLE_TOOLS)
    assert report.first_mismatch == tape.turns[0].start
    assert tape.token_ids[report.first_mismatch] == THINK
    assert report.tape_context.count("<think>") > report.render_context.count("<think>")
    # Live, the stock template cannot bridge that follow-up: it would rewrite the previous turn.
    with pytest.raises(TemplateError, match="earlier turns"):
        stock.observation([Message("user", "And its EBITDA?")])


def test_the_fixed_base_observation_also_works_on_qwen3s_stock_template(
    tok: PreTrainedTokenizerFast,
) -> None:
    stock = stock_qwen3(tok)
    text = stock.decode(stock.observation([ToolResult("a", "1\n2"), ToolResult("b", "3")]))
    assert text == ("\n<|im_start|>user\n<tool_response>\n1\n2\n</tool_response>\n"
                    "<tool_response>\n3\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert stock.observation([ToolResult("a", "x")]) == ChatTemplateRenderer(tok).observation(
        [ToolResult("a", "x")])


def test_drift_never_changes_the_tape(tok: PreTrainedTokenizerFast,
                                      renderer: ChatTemplateRenderer) -> None:
    tape, messages = run_episode(renderer, [sampled(tok, t) for t in TURNS])
    before = (tape.token_ids, tape.loss_mask, tape.logprobs, tape.turns)
    changed = [*messages[:-1], Message("assistant", "Something else.")]
    assert not drift(tape, renderer, changed, EXAMPLE_TOOLS).ok
    assert (tape.token_ids, tape.loss_mask, tape.logprobs, tape.turns) == before
