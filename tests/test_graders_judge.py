"""The LLM judge over real HTTP: fenced JSON parses, failures are errors, off by default."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kwrl.graders import GraderError, grade, take_snapshot
from kwrl.graders.errors import JudgeError
from kwrl.graders.judge import JudgeConfig, judge, parse_verdict
from kwrl.types import Criterion, CriterionKind


class FakeJudge:
    """A chat-completions endpoint on localhost that answers from a script of replies."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, str]] = []
        self.requests: list[dict[str, Any]] = []
        self.delay_s = 0.0
        self.abandoned = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                auth = self.headers.get("Authorization")
                outer.requests.append({"path": self.path, "auth": auth, "body": body})
                time.sleep(outer.delay_s)
                status, content = outer.replies.pop(0) if outer.replies else (500, "")
                payload = {"choices": [{"message": {"role": "assistant", "content": content}}]}
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    outer.abandoned += 1  # the client timed out and hung up, as tested

            def log_message(self, *_: object) -> None:
                pass  # keep test output quiet

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def config(self, **overrides: Any) -> JudgeConfig:
        return JudgeConfig(**{"base_url": self.url, "model": "judge-1", **overrides})


@pytest.fixture
def fake_judge() -> Iterator[FakeJudge]:
    fake = FakeJudge()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        fake.thread.join(timeout=5)


FENCED = '```json\n{"rationale": "States 4.5m as required.", "is_criteria_true": true}\n```'


def test_a_fenced_json_verdict_is_parsed(fake_judge: FakeJudge) -> None:
    fake_judge.replies.append((200, FENCED))
    verdict = judge("The answer states revenue of 4.5m.", "Revenue: 4.5m", fake_judge.config())
    assert verdict.is_true and verdict.rationale == "States 4.5m as required."
    (request,) = fake_judge.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["body"]["model"] == "judge-1"
    assert "Revenue: 4.5m" in request["body"]["messages"][1]["content"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"rationale": "no", "is_criteria_true": false}', False),
        (
            '<think>hmm {"x": 1}</think>\nVerdict: {"rationale": "ok", "is_criteria_true": true}',
            True,
        ),
        ('```\n{"rationale": "ok", "is_criteria_true": "true"}\n```', True),
    ],
)
def test_verdicts_in_prose_think_blocks_and_plain_fences(content: str, expected: bool) -> None:
    assert parse_verdict(content).is_true is expected


def test_a_reply_without_a_verdict_is_a_judge_error() -> None:
    with pytest.raises(JudgeError, match="no JSON object"):
        parse_verdict("I think it is true.")
    with pytest.raises(JudgeError, match="boolean 'is_criteria_true'"):
        parse_verdict('{"rationale": "x", "is_criteria_true": "maybe"}')


def test_a_server_error_is_retried(fake_judge: FakeJudge) -> None:
    fake_judge.replies += [(503, ""), (200, FENCED)]
    assert judge("s", "a", fake_judge.config()).is_true
    assert len(fake_judge.requests) == 2


def test_the_api_key_is_sent_as_a_bearer_token(fake_judge: FakeJudge) -> None:
    fake_judge.replies.append((200, FENCED))
    judge("s", "a", fake_judge.config(api_key="sk-test"))
    assert fake_judge.requests[0]["auth"] == "Bearer sk-test"


def test_a_slow_judge_times_out_as_an_error(fake_judge: FakeJudge) -> None:
    fake_judge.delay_s = 1.0
    fake_judge.replies.append((200, FENCED))
    started = time.monotonic()
    with pytest.raises(JudgeError, match="ReadTimeout"):
        judge("s", "a", fake_judge.config(timeout_s=0.2, attempts=1))
    assert time.monotonic() - started < 1.0


def test_a_client_error_is_not_retried(fake_judge: FakeJudge) -> None:
    fake_judge.replies.append((401, "denied"))
    with pytest.raises(JudgeError, match="HTTP 401"):
        judge("s", "a", fake_judge.config())
    assert len(fake_judge.requests) == 1


def judge_rubric() -> list[Criterion]:
    statement = {"statement": "The answer recommends Acme."}
    return [Criterion("j", CriterionKind.LLM_JUDGE, "judge", 1.0, statement)]


def test_llm_judge_criterion_through_grade(
    fake_judge: FakeJudge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KWRL_JUDGE_BASE_URL", fake_judge.url)
    monkeypatch.setenv("KWRL_JUDGE_MODEL", "judge-1")
    fake_judge.replies.append((200, FENCED))
    snapshot = take_snapshot(tmp_path)
    result = grade(judge_rubric(), "We recommend Acme.", snapshot, snapshot)
    assert result.passed
    assert result.criteria[0].reason == "judge: States 4.5m as required."


def test_llm_judge_without_an_endpoint_is_a_grader_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KWRL_JUDGE_BASE_URL", raising=False)
    snapshot = take_snapshot(tmp_path)
    with pytest.raises(GraderError, match="llm_judge criterion needs KWRL_JUDGE_BASE_URL"):
        grade(judge_rubric(), "We recommend Acme.", snapshot, snapshot)
