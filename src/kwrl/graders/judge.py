"""The optional LLM judge: an OpenAI-compatible chat endpoint decides one statement about an answer.

Off by default: every other criterion kind is exact, and a reward that depends on a remote model
is neither reproducible nor free. When a rubric does use `llm_judge`, the endpoint comes from the
environment (`KWRL_JUDGE_BASE_URL`, e.g. `http://localhost:8000/v1`, `KWRL_JUDGE_MODEL`,
`KWRL_JUDGE_API_KEY`, optional `KWRL_JUDGE_TIMEOUT` seconds). A missing endpoint, a timeout, an
HTTP failure or a reply that cannot be parsed is a `JudgeError`: the trial becomes an error and is
masked, never a 0 (Archipelago scored such failures 0, and fenced JSON from some judges zeroed
whole tasks, archipelago #97, so the parser accepts ```json fences, think blocks and prose around
the object).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kwrl.graders.errors import JudgeError

if TYPE_CHECKING:
    import httpx

SYSTEM_PROMPT = (
    "You grade one criterion of a professional task. Decide whether the statement is true of the "
    "answer, judging only the statement. Be strict about facts, names and values; be tolerant of "
    "formatting and rounding. Claims in the answer about files count only as claims. Reply with "
    'JSON only: {"rationale": "<one or two sentences>", "is_criteria_true": true or false}.'
)


@dataclass(frozen=True)
class JudgeConfig:
    base_url: str
    """OpenAI-compatible base URL; `/chat/completions` is appended."""
    model: str
    api_key: str = ""
    timeout_s: float = 60.0
    """Per request."""
    attempts: int = 3
    """Tries on transport errors, 429/5xx answers and unparseable replies."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JudgeConfig:
        env = os.environ if env is None else env
        base_url = env.get("KWRL_JUDGE_BASE_URL", "").strip()
        if not base_url:
            raise JudgeError(
                "llm_judge criterion needs KWRL_JUDGE_BASE_URL (an OpenAI-compatible endpoint, "
                "e.g. http://localhost:8000/v1) and KWRL_JUDGE_MODEL; the judge is off by default"
            )
        model = env.get("KWRL_JUDGE_MODEL", "").strip()
        if not model:
            raise JudgeError("llm_judge criterion needs KWRL_JUDGE_MODEL (the served model name)")
        try:
            timeout_s = float(env.get("KWRL_JUDGE_TIMEOUT", "60"))
        except ValueError:
            raise JudgeError("KWRL_JUDGE_TIMEOUT must be a number of seconds") from None
        return cls(base_url, model, env.get("KWRL_JUDGE_API_KEY", ""), timeout_s)


@dataclass(frozen=True)
class Verdict:
    is_true: bool
    rationale: str


def judge(statement: str, answer: str, config: JudgeConfig | None = None) -> Verdict:
    """Ask the judge whether `statement` holds for `answer`; raises JudgeError on any failure."""
    import httpx  # here, not at module level: most verifier processes never judge

    config = config or JudgeConfig.from_env()
    url = config.base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    body = {
        "model": config.model,
        "temperature": 0,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": _user_prompt(statement, answer)},
        ],
    }
    problem = "no attempt made"
    with httpx.Client(timeout=httpx.Timeout(config.timeout_s)) as client:
        for attempt in range(max(1, config.attempts)):
            try:
                response = client.post(url, json=body, headers=headers)
            except httpx.HTTPError as exc:
                problem = f"request to {url} failed: {type(exc).__name__}: {exc}"
                _backoff(attempt, config.attempts)
                continue
            if response.status_code == 429 or response.status_code >= 500:
                problem = f"{url} answered HTTP {response.status_code}"
                _backoff(attempt, config.attempts)
                continue
            if response.status_code != 200:
                raise JudgeError(
                    f"{url} answered HTTP {response.status_code}: {response.text[:200]}"
                )
            try:
                return parse_verdict(_message_content(response))
            except JudgeError as exc:
                problem = str(exc)
    raise JudgeError(f"judge failed after {config.attempts} attempts: {problem}")


def _backoff(attempt: int, attempts: int) -> None:
    if attempt + 1 < attempts:
        time.sleep(min(2.0, 0.25 * 2**attempt))


def _user_prompt(statement: str, answer: str) -> str:
    return (
        f"Statement to check:\n{statement}\n\n"
        f"The answer to judge:\n<answer>\n{answer or '(empty answer)'}\n</answer>"
    )


def _message_content(response: httpx.Response) -> str:
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise JudgeError(f"not a chat-completions reply ({exc}): {response.text[:200]}") from None
    if not isinstance(content, str):
        raise JudgeError(f"judge reply has no text content: {response.text[:200]}")
    return content


_FENCED = re.compile(r"```(?:json|JSON)?\s*(\{.*?\})\s*```", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def parse_verdict(content: str) -> Verdict:
    """`{"rationale": ..., "is_criteria_true": bool}` from a reply, fenced or bare."""
    content = _THINK.sub("", content).strip()
    raw = _json_object(content)
    if raw is None:
        raise JudgeError(f"judge reply holds no JSON object: {content[:200]!r}")
    verdict = raw.get("is_criteria_true")
    if isinstance(verdict, str) and verdict.strip().lower() in ("true", "false"):
        verdict = verdict.strip().lower() == "true"
    if not isinstance(verdict, bool):
        raise JudgeError(f"judge reply lacks a boolean 'is_criteria_true': {content[:200]!r}")
    return Verdict(verdict, str(raw.get("rationale", "")).strip())


def _json_object(content: str) -> dict[str, Any] | None:
    candidates = [m.group(1) for m in _FENCED.finditer(content)] + [content]
    start, end = content.find("{"), content.rfind("}")
    if 0 <= start < end:
        candidates.append(content[start : end + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None
