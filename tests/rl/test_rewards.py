"""Rewards (paper §3): rule-based outcome, length penalty, language consistency, generative RM with
rubrics (local callable and a real OpenAI-compatible HTTP server), per-domain composition."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv32.rl.grpo.rewards import (
    DEFAULT_RUBRIC,
    GenerativeRewardModel,
    JudgeError,
    RewardModelError,
    RewardSample,
    RewardSpec,
    answers_equal,
    char_script,
    compose_rewards,
    default_reward_specs,
    dominant_scripts,
    exact_match_reward,
    extract_boxed,
    format_reward,
    language_consistency,
    length_penalty,
    math_reward,
    parse_score,
)

COT_THREE_QUARTERS = (
    "We need the probability that at least one of two fair coins shows heads.\n"
    "The complement is both tails, with probability $\\frac{1}{2} \\cdot \\frac{1}{2} = \\frac{1}{4}$.\n"
    "So $P = 1 - \\frac{1}{4} = \\frac{3}{4}$.\n\nTherefore the answer is $\\boxed{\\frac{3}{4}}$."
)
# SymPy evaluates the factorial exactly: about ten seconds of CPU, far past a 1 s timeout.
PATHOLOGICAL = "So the number of orderings is \\boxed{(10^{6})!}"


# --- extract_boxed --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (COT_THREE_QUARTERS, "\\frac{3}{4}"),
        ("first \\boxed{2}, then corrected: \\boxed{3}.", "3"),
        ("\\boxed {x+1}", "x+1"),
        ("\\fbox{42}", "42"),
        ("\\boxed{\\sqrt{\\frac{a^{2}}{b}}} done", "\\sqrt{\\frac{a^{2}}{b}}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{}", ""),
        ("no box here, the answer is 5", None),
        ("so the answer is \\boxed{\\frac{3}{", None),  # cut off mid-box
        ("\\boxed{1} ... \\boxed{\\frac{3}{4}", None),  # the last box is the final answer: unfinished
        ("\\boxedx{3}", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


# --- math_reward ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        (COT_THREE_QUARTERS, "0.75", 1.0),
        (COT_THREE_QUARTERS, "3/4", 1.0),
        (COT_THREE_QUARTERS, "\\frac{3}{4}", 1.0),
        (COT_THREE_QUARTERS, "0.7", 0.0),
        (COT_THREE_QUARTERS, "4/3", 0.0),
        ("Half of it: \\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{42}", 42, 1.0),
        ("\\boxed{41}", "42", 0.0),
        ("I first got \\boxed{5}, but rechecking, the answer is \\boxed{6}.", "6", 1.0),
        ("The answer is \\boxed{6}. Hmm, no: \\boxed{5}.", "6", 0.0),
        ("The total is \\boxed{1,000} dollars", "1000", 1.0),
        ("The total is \\boxed{1,000} dollars", "1", 0.0),
        ("\\boxed{\\dfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt 3}{2}", 1.0),
        ("\\boxed{x = 2}", "2", 1.0),
        ("The answer is 0.75.", "0.75", 0.0),  # no box
        ("... therefore \\boxed{\\frac{3}{", "0.75", 0.0),  # cut mid-box
        ("\\boxed{}", "0", 0.0),
    ],
)
def test_math_reward(completion, answer, expected):
    assert math_reward(completion, answer) == expected


@pytest.mark.parametrize(
    "garbage",
    [
        "\\boxed{}}}{{{\\frac",
        "\\boxed{\\frac{}{}}",
        "\\boxed{$$$}",
        "\\boxed{\x00\x01\ufffd}",
        "\\boxed{" + "(" * 120 + "}",
    ],
)
def test_math_reward_garbage_is_zero_not_an_error(garbage):
    assert math_reward(garbage, "1") == 0.0


def test_math_reward_in_worker_threads_matches_main_thread():
    cases = [
        (COT_THREE_QUARTERS, "0.75"),
        (COT_THREE_QUARTERS, "0.7"),
        ("\\boxed{1,000}", "1000"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{7}", "8"),
        ("no box", "1"),
    ]
    expected = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert [math_reward(c, a) for c, a in cases] == expected  # main thread: math-verify's signal timeout
    with ThreadPoolExecutor(max_workers=2) as pool:  # worker threads: math-verify in worker processes
        got = list(pool.map(lambda case: math_reward(*case), cases))
    assert got == expected


def test_math_reward_timeout_in_a_thread_then_recovers(caplog):
    results: list[tuple[float, float]] = []

    def run():
        for completion in (PATHOLOGICAL, "\\boxed{\\frac{6}{8}}"):
            start = time.monotonic()
            results.append((math_reward(completion, "0.75", timeout_seconds=1), time.monotonic() - start))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    (hung, hung_s), (ok, _) = results
    assert hung == 0.0 and hung_s < 30  # startup of the worker (SymPy import) is not part of the timeout
    assert "ran past 1.0 s" in caplog.text  # the worker was killed, not left running
    assert ok == 1.0  # and replaced


def test_math_reward_timeout_in_main_thread(caplog):
    caplog.set_level(logging.WARNING, logger="math_verify")  # other packages may quiet this logger
    start = time.monotonic()
    assert math_reward(PATHOLOGICAL, "1", timeout_seconds=1) == 0.0
    assert time.monotonic() - start < 8
    assert "Timeout during" in caplog.text  # math-verify's own (signal) timeout fired


def test_answers_equal_rejects_non_positive_timeout():
    with pytest.raises(ValueError, match="timeout_seconds"):
        answers_equal("1", "1", timeout_seconds=0)
    assert answers_equal("2/4", "0.5", timeout_seconds=None)


# --- exact match and format -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("The capital of France is Paris.\nAnswer: Paris.", "paris", 1.0),
        ("Let me compare the options.\n**Final answer:** B", "B", 1.0),
        ("Answer: A\nWait, that is wrong.\nAnswer: C", "C", 1.0),
        ("Answer: A\nWait, that is wrong.\nAnswer: C", "A", 0.0),
        ("So it is \\boxed{\\text{Paris}}.", "Paris", 1.0),
        ("  Mount   Everest \n", "mount everest", 1.0),
        ("Answer: Lyon", "Paris", 0.0),
        ("<think>Answer: A would be my guess</think>Answer: B", "B", 1.0),
        ("Answer: yes", ["Yes", "True"], 1.0),
    ],
)
def test_exact_match_reward(completion, answer, expected):
    assert exact_match_reward(completion, answer) == expected


def test_exact_match_without_normalization_is_case_sensitive():
    assert exact_match_reward("Answer: Paris", "Paris", normalize=False) == 1.0
    assert exact_match_reward("Answer: paris", "Paris", normalize=False) == 0.0
    with pytest.raises(ValueError, match="accepted answer"):
        exact_match_reward("Answer: x", [])


@pytest.mark.parametrize(
    ("completion", "kwargs", "expected"),
    [
        (COT_THREE_QUARTERS, {}, 1.0),
        ("first \\boxed{2}, then \\boxed{3}", {}, 0.0),
        ("the answer is 3", {}, 0.0),
        ("the answer is \\boxed{3", {}, 0.0),
        ("the answer is \\boxed{ }", {}, 0.0),
        ("the answer is 3", {"require_boxed": False}, 1.0),
        ("Compute 1+1 = 2.</think>The answer is \\boxed{2}.", {"thinking": True}, 1.0),
        (
            "<think>Compute 1+1 = 2.</think>The answer is \\boxed{2}.<｜end▁of▁sentence｜>",
            {"thinking": True},
            1.0,
        ),
        ("maybe \\boxed{1}? no, 2.</think>The answer is \\boxed{2}.", {"thinking": True}, 1.0),
        ("Compute 1+1 = 2, so \\boxed{2}", {"thinking": True}, 0.0),  # reasoning never closed
        ("so \\boxed{2}</think>", {"thinking": True}, 0.0),  # box only inside the reasoning
        ("so 2</think>  <｜end▁of▁sentence｜>", {"thinking": True, "require_boxed": False}, 0.0),
        ("a</think>b</think>\\boxed{2}", {"thinking": True}, 0.0),
        ("a</think><think>\\boxed{2}", {"thinking": True}, 0.0),
        ("Compute.</think>It is 2.", {"thinking": True, "require_boxed": False}, 1.0),
    ],
)
def test_format_reward(completion, kwargs, expected):
    assert format_reward(completion, **kwargs) == expected


# --- length penalty -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "expected"),
    [(0, 0.0), (80, 0.0), (81, -0.05), (90, -0.5), (99, -0.95), (100, -1.0), (101, -1.0), (10**6, -1.0)],
)
def test_overlong_penalty_boundaries(n, expected):
    assert length_penalty(n, max_tokens=100, shape="overlong", cache_tokens=20) == pytest.approx(expected)
    # default cache: max_tokens // 5 (DAPO's 4096 of 20480)
    assert length_penalty(n, max_tokens=100) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "expected"), [(0, 0.0), (25, -0.25), (100, -1.0), (150, -1.5)])
def test_linear_and_none_penalties(n, expected):
    assert length_penalty(n, max_tokens=100, shape="linear") == pytest.approx(expected)
    assert length_penalty(n, max_tokens=100, shape="none") == 0.0


@given(st.integers(1, 10_000), st.integers(0, 20_000), st.integers(0, 20_000))
@settings(max_examples=200, deadline=None)
def test_overlong_penalty_bounded_and_monotone(max_tokens, a, b):
    cache = max(1, max_tokens // 3)
    lo, hi = sorted((a, b))
    p_lo = length_penalty(lo, max_tokens=max_tokens, cache_tokens=cache)
    p_hi = length_penalty(hi, max_tokens=max_tokens, cache_tokens=cache)
    assert -1.0 <= p_hi <= p_lo <= 0.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_tokens": 5, "max_tokens": 10, "shape": "cubic"}, "unknown length penalty shape"),
        ({"num_tokens": 5, "max_tokens": 0}, "max_tokens"),
        ({"num_tokens": -1, "max_tokens": 10}, "num_tokens"),
        ({"num_tokens": 5, "max_tokens": 10, "cache_tokens": 11}, "cache_tokens"),
        ({"num_tokens": 5, "max_tokens": 10, "cache_tokens": 0}, "cache_tokens"),
    ],
)
def test_length_penalty_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        length_penalty(**kwargs)


# --- language consistency -------------------------------------------------------------------------------

ZH_PROMPT = "已知函数 $f(x) = x^2 - 4x + 3$，求函数在区间 $[0, 3]$ 上的最小值。请逐步推理，并把最终答案写在 \\boxed{} 中。"


@pytest.mark.parametrize(
    ("ch", "script"),
    [
        ("a", "Latin"),
        ("é", "Latin"),
        ("Ａ", "Latin"),
        ("中", "Han"),
        ("あ", "Kana"),
        ("ア", "Kana"),
        ("ー", "Kana"),
        ("한", "Hangul"),
        ("д", "Cyrillic"),
        ("ب", "Arabic"),
        ("क", "Devanagari"),
        ("λ", "Greek"),
        ("א", "Hebrew"),
        ("ก", "Thai"),
        ("7", None),
        ("!", None),
        (" ", None),
        ("𝑥", None),  # mathematical italic x
    ],
)
def test_char_script(ch, script):
    assert char_script(ch) == script


def test_chinese_prompt_english_answer_scores_low():
    english = (
        "We complete the square: f(x) = (x - 2)^2 - 1. On the interval the minimum is at x = 2, "
        "so the minimum value is \\boxed{-1}."
    )
    chinese = "配方得 $f(x) = (x-2)^2 - 1$，在区间上当 $x = 2$ 时取得最小值，所以最小值为 $\\boxed{-1}$。"
    assert language_consistency(ZH_PROMPT, english) == 0.0
    assert language_consistency(ZH_PROMPT, chinese) == 1.0


def test_mixed_scripts_give_the_letter_fraction():
    # Han: 这是答案 (4 letters); Latin: "this" + "is" (6 letters) → 4 / 10
    assert language_consistency("求函数的最小值", "这是答案 this is") == pytest.approx(0.4)
    # Cyrillic "Ответ" (5) + Latin "answer" (6) → 5 / 11 for a Russian prompt
    assert language_consistency("Найдите наименьшее значение функции.", "Ответ answer") == pytest.approx(
        5 / 11
    )


def test_latex_code_and_variables_are_not_counted():
    completion = (
        "由 $\\frac{\\sin x}{\\cos x} = \\tan x$ 可知，\\[ \\int_0^1 f(x)\\,dx = \\frac{1}{2} \\]"
        "设 x = 3，则 y = 6。代码如下：\n```python\nprint(sum(range(10)))\n```\n"
        "参见 `numpy.sum`。答案是 \\boxed{\\frac{1}{2}}。<｜end▁of▁sentence｜>"
    )
    assert language_consistency(ZH_PROMPT, completion) == 1.0
    # the same Chinese prose with the LaTeX counted as letters would not be consistent
    assert language_consistency(ZH_PROMPT, "由 sin cos tan int frac 可知") < 0.5


def test_no_letters_scores_one():
    assert language_consistency(ZH_PROMPT, "42 + 7 = 49; $x^2$ ✓") == 1.0
    assert language_consistency("1 + 1 = ?", "这是 two") == 1.0  # no language in the prompt to keep


def test_dominant_script_resists_an_english_template_and_handles_japanese():
    templated = ZH_PROMPT + "\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert dominant_scripts(templated) == {"Han"}
    assert dominant_scripts("東京は日本の首都です。人口はどのくらいですか。") == {"Han", "Kana"}
    assert language_consistency("東京の人口は？", "東京都の人口は約1400万人です。") == 1.0
    assert dominant_scripts("What is the capital of France?") == {"Latin"}
    assert language_consistency(ZH_PROMPT, "the answer", scripts={"Latin"}) == 1.0


# --- parse_score ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The response is accurate.\nScore: 7", 7.0),
        ("The answer covers everything.\n\n**Score:** 8.5", 8.5),
        ("Final Score: 9/10.", 9.0),
        ("SCORE: 10", 10.0),
        ("Score: **7**/10", 7.0),
        ("Score: 7.5 / 10", 7.5),
        ("Reasoning.\r\nScore: 6/10\r\n", 6.0),
        ("Score: 4/5", 8.0),  # another denominator: rescaled
        ("Score: 12/10", 10.0),  # clamped
        ("Score: -3", 0.0),  # clamped
        ("Score: 3/10\nAfter checking the rubric again...\nScore: 8/10", 8.0),  # the last line
        ("Score: 7/10\nIt meets 3/4 of the criteria.", 7.0),
        # a score inside a sentence is not read: the judge may be quoting the response
        ("Score: 2/10\n(The response itself asserts 'Score: 10/10'.)", 2.0),
        ("The response is poor.\nScore: 2/10\nIt claims Score: 10/10 for itself.", 2.0),
    ],
)
def test_parse_score(text, expected):
    assert parse_score(text, 10) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Score: N/A",
        "The response meets 2/3 criteria.",
        "Looks good to me!",
        "The response is poor: Score: 2/10\n(The response itself asserts 'Score: 10/10'.)",
        "Overall I would give this 7 out of 10.",
        "Rating: [[6]]",
        "The final answer is \\boxed{6}",
        "Score:\n4",
    ],
)
def test_parse_score_none(text):
    assert parse_score(text, 10) is None


def test_parse_score_other_scale():
    assert parse_score("Score: 4/5", 5) == 4.0
    assert parse_score("Score: 9", 5) == 5.0
    with pytest.raises(ValueError):
        parse_score("Score: 1", 0)


# --- generative reward model: local judge -------------------------------------------------------------------

RUBRIC = "1. States that the capital is Paris. 2. Mentions the Seine. 3. At most three sentences."


def test_local_judge_gets_question_rubric_and_response():
    seen = []

    def judge(messages):
        seen.append(messages)
        return "It names Paris and the Seine in two sentences. All criteria met except brevity is fine.\nScore: 9/10"

    grm = GenerativeRewardModel(judge=judge)
    judgement = grm.evaluate("What is the capital of France?", "Paris, on the Seine.", RUBRIC)
    assert judgement.reward == pytest.approx(0.9) and judgement.score == 9.0 and judgement.error is None
    (messages,) = seen
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "What is the capital of France?" in user and RUBRIC in user and "Paris, on the Seine." in user
    assert "Score: X/10" in user
    assert DEFAULT_RUBRIC in grm.messages("q", "r")[1]["content"]
    assert grm.stats.requests == 1 and grm.stats.failures == 0


def test_local_judge_failure_and_unparseable_reply_give_the_fallback():
    def failing(messages):
        raise JudgeError("model OOM")

    grm = GenerativeRewardModel(judge=failing, fallback=0.25)
    judgement = grm.evaluate("q", "r")
    assert judgement.reward == 0.25 and not judgement.scored and judgement.error == "model OOM"
    with pytest.raises(JudgeError, match="model OOM"):  # the bare reward has none to give
        grm("q", "r")
    assert grm.stats.failures == 2 and grm.stats.parse_failures == 0

    grm = GenerativeRewardModel(judge=lambda m: "A decent answer overall.", fallback=0.5, scale=5)
    judgement = grm.evaluate("q", "r")
    assert (
        judgement.reward == 0.5 and judgement.score is None and judgement.text == "A decent answer overall."
    )
    assert grm.stats.parse_failures == 1 and grm.stats.requests == 1

    with pytest.raises(RewardModelError, match="must return str"):
        GenerativeRewardModel(judge=lambda m: 7)("q", "r")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "neither"),
        ({"base_url": "http://x/v1", "model": "m", "judge": lambda m: ""}, "both"),
        ({"base_url": "http://x/v1"}, "needs model"),
        ({"judge": "not callable"}, "callable"),
        ({"judge": lambda m: "", "scale": 0}, "scale"),
        ({"judge": lambda m: "", "fallback": 2.0}, "fallback"),
        ({"judge": lambda m: "", "max_retries": -1}, "max_retries"),
    ],
)
def test_reward_model_configuration_errors(kwargs, match):
    with pytest.raises(RewardModelError, match=match):
        GenerativeRewardModel(**kwargs)


# --- generative reward model: OpenAI-compatible HTTP server ---------------------------------------------------


def _completion(content: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
    }


class _JudgeServer(ThreadingHTTPServer):
    """Answers POST /v1/chat/completions from a script of (status, body, headers); records requests."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _JudgeHandler)
        self.script: list[tuple[int, object, dict]] = []
        self.received: list[dict] = []
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _JudgeHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server: _JudgeServer = self.server
        with server.lock:
            server.received.append(
                {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
            )
            status, payload, headers = (
                server.script.pop(0) if server.script else (200, _completion("Good.\nScore: 7/10"), {})
            )
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        if self.path != "/v1/chat/completions":
            status, data = 404, b'{"error": "not found"}'
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # keep test output quiet
        pass


@pytest.fixture
def judge_server():
    server = _JudgeServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_http_judge_request_body_and_score(judge_server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
    grm = GenerativeRewardModel(base_url=judge_server.base_url + "/", model="judge-model", max_tokens=256)
    judgement = grm.evaluate("What is the capital of France?", "Paris, on the Seine.", RUBRIC)
    assert judgement.reward == pytest.approx(0.7) and judgement.score == 7.0
    (request,) = judge_server.received
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test-123"
    body = request["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["max_tokens"] == 256
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert (
        RUBRIC in body["messages"][1]["content"] and "Paris, on the Seine." in body["messages"][1]["content"]
    )


def test_http_judge_retries_after_503_and_429(judge_server):
    judge_server.script = [
        (503, {"error": "overloaded"}, {}),
        (429, {"error": "slow down"}, {"Retry-After": "0"}),
        (200, _completion("Meets the rubric.\n**Score:** 8"), {}),
    ]
    grm = GenerativeRewardModel(base_url=judge_server.base_url, model="m", api_key="k", backoff=0.01)
    assert grm("q", "r", RUBRIC) == pytest.approx(0.8)
    assert len(judge_server.received) == 3
    assert grm.stats.retries == 2 and grm.stats.failures == 0 and grm.stats.requests == 1


def test_http_judge_unparseable_reply_gives_fallback(judge_server):
    judge_server.script = [(200, _completion("The response is fine, I suppose."), {})]
    grm = GenerativeRewardModel(base_url=judge_server.base_url, model="m", api_key="k", fallback=0.1)
    judgement = grm.evaluate("q", "r", RUBRIC)
    assert judgement.reward == 0.1 and judgement.score is None
    assert grm.stats.parse_failures == 1 and grm.stats.failures == 0 and grm.stats.requests == 1


def test_http_judge_gives_up_after_retries_and_on_bad_replies(judge_server):
    judge_server.script = [(500, {"error": "boom"}, {})] * 3
    grm = GenerativeRewardModel(
        base_url=judge_server.base_url, model="m", api_key="k", max_retries=2, backoff=0.01
    )
    judgement = grm.evaluate("q", "r")
    assert judgement.reward == 0.0 and "after 3 attempts" in judgement.error and "HTTP 500" in judgement.error
    assert len(judge_server.received) == 3 and grm.stats.failures == 1

    judge_server.script = [(400, {"error": "context too long"}, {}), (200, "<html>not json</html>", {})]
    assert not grm.evaluate("q", "r").scored  # a 400 is not retried
    with pytest.raises(JudgeError, match="chat completion"):  # a reply that is not a chat completion
        grm("q", "r")
    assert len(judge_server.received) == 5 and grm.stats.failures == 3 and grm.stats.retries == 2


def test_http_judge_misconfiguration_raises(judge_server):
    judge_server.script = [(401, {"error": "invalid api key"}, {})]
    grm = GenerativeRewardModel(base_url=judge_server.base_url, model="m", api_key="bad")
    with pytest.raises(RewardModelError, match="HTTP 401"):
        grm("q", "r")
    grm = GenerativeRewardModel(base_url=judge_server.base_url.removesuffix("/v1"), model="m", api_key="k")
    with pytest.raises(RewardModelError, match="HTTP 404"):  # base_url without /v1
        grm("q", "r")


def test_http_judge_connection_refused_is_a_counted_failure():
    server = _JudgeServer()
    url = server.base_url
    server.server_close()  # nothing listens on this port any more
    grm = GenerativeRewardModel(
        base_url=url, model="m", api_key="k", max_retries=1, backoff=0.01, fallback=0.2
    )
    judgement = grm.evaluate("q", "r")
    assert judgement.reward == 0.2 and grm.stats.failures == 1 and grm.stats.retries == 1


def test_http_judge_from_many_threads(judge_server):
    grm = GenerativeRewardModel(base_url=judge_server.base_url, model="m", api_key="k")
    with ThreadPoolExecutor(max_workers=4) as pool:
        rewards = list(pool.map(lambda i: grm(f"question {i}", "r"), range(8)))
    assert rewards == [pytest.approx(0.7)] * 8 and grm.stats.requests == 8
    questions = sorted(r["body"]["messages"][1]["content"].split("\n")[3] for r in judge_server.received)
    assert questions == sorted(f"question {i}" for i in range(8))


# --- composition ---------------------------------------------------------------------------------------------


def _rule_specs(**kwargs):
    """The default specs of the rule-based domains (``general`` needs a reward model)."""
    specs = default_reward_specs(**kwargs)
    del specs["general"]
    return specs


def _math_sample(completion, answer="3/4", n=500, domain="math"):
    return {
        "domain": domain,
        "prompt": "Two fair coins are tossed. What is the probability of at least one head?",
        "completion": completion,
        "num_completion_tokens": n,
        "answer": answer,
    }


def test_default_math_domain():
    reward = compose_rewards(_rule_specs(max_tokens=1000))
    right = reward(_math_sample(COT_THREE_QUARTERS))
    assert right.components == {"math": 1.0, "format": 1.0, "length": 0.0, "language": 1.0}
    assert right.total == pytest.approx(1.2) and right.correct is True
    wrong = reward(_math_sample(COT_THREE_QUARTERS, answer="1/2", n=900))  # 900 > 1000 - 200: penalised
    assert wrong.components["math"] == 0.0 and wrong.components["length"] == pytest.approx(-0.5)
    assert wrong.total == pytest.approx(0.0 + 0.1 - 0.5 + 0.1) and wrong.correct is False
    truncated = reward(_math_sample("so the answer is \\boxed{\\frac{3}{", n=1000))
    assert truncated.components["math"] == 0.0 and truncated.components["length"] == -1.0


def test_thinking_mode_scores_the_answer_after_the_reasoning():
    reward = compose_rewards(_rule_specs(max_tokens=1000, thinking=True))
    done = reward(
        _math_sample(
            "1 - 1/4 = 3/4, so \\boxed{3/4} it is.</think>The probability is $\\boxed{\\frac{3}{4}}$."
        )
    )
    assert done.correct is True and done.components["format"] == 1.0
    unfinished = reward(_math_sample("1 - 1/4 = 3/4, so \\boxed{\\frac{3}{4}} it is"))
    assert unfinished.correct is False and unfinished.components["format"] == 0.0


def test_general_domain_uses_the_rubric_of_each_sample():
    seen = []

    def judge(messages):
        seen.append(messages[1]["content"])
        return "Score: 6/10" if "It lies on the Seine." in messages[1]["content"] else "Score: 2/10"

    reward = compose_rewards(
        default_reward_specs(max_tokens=1000, thinking=True), grm=GenerativeRewardModel(judge=judge)
    )
    sample = RewardSample(
        domain="general",
        prompt="Describe Paris in two sentences.",
        completion="The user wants two sentences.</think>Paris is the capital of France. It lies on the Seine.",
        rubric=RUBRIC,
    )
    result = reward(sample)
    assert result.components == {"grm": pytest.approx(0.6), "language": 1.0}
    assert result.total == pytest.approx(0.7) and result.correct is None
    assert (
        RUBRIC in seen[0] and "The user wants two sentences." not in seen[0]
    )  # the judge sees the answer only


def test_exact_domain_with_a_task_like_object():
    @dataclass
    class Rollout:
        domain: str
        prompt: str
        completion: str
        num_completion_tokens: int
        answer: str | None = None

    reward = compose_rewards(_rule_specs(max_tokens=100))
    got = reward(
        Rollout("exact", "Which river flows through Paris?", "It is the Seine.\nAnswer: Seine", 10, "seine")
    )
    assert got.correct is True and got.total == pytest.approx(1.1)
    miss = reward(Rollout("exact", "Which river flows through Paris?", "Answer: Loire", 95, "Seine"))
    assert miss.correct is False and miss.total == pytest.approx(-0.75 + 0.1)


def test_composition_errors_name_what_is_known():
    reward = compose_rewards(
        default_reward_specs(max_tokens=100), grm=GenerativeRewardModel(judge=lambda m: "")
    )
    with pytest.raises(ValueError, match=r"unknown domain|known domains: \['exact', 'general', 'math'\]"):
        reward(_math_sample(COT_THREE_QUARTERS, domain="poetry"))
    with pytest.raises(ValueError, match=r"unknown reward components \['speed'\]; known: .*'grm'"):
        RewardSpec({"math": 1.0, "speed": 0.5})
    with pytest.raises(ValueError, match="needs max_tokens"):
        RewardSpec({"math": 1.0, "length": 1.0})
    with pytest.raises(ValueError, match="finite"):
        RewardSpec({"math": float("nan")})
    with pytest.raises(RewardModelError, match="no GenerativeRewardModel"):
        compose_rewards(default_reward_specs(max_tokens=100))
    with pytest.raises(ValueError, match="reference 'answer'"):
        reward(_math_sample(COT_THREE_QUARTERS, answer=None))
    with pytest.raises(ValueError, match="'completion'"):
        reward({"domain": "math", "prompt": "p", "answer": "1"})


def test_spec_from_toml_table():
    spec = RewardSpec.from_dict(
        {"weights": {"math": 1.0, "length": 0.5}, "max_tokens": 2048, "length_shape": "linear"}
    )
    reward = compose_rewards({"math": spec})
    result = reward(_math_sample(COT_THREE_QUARTERS, n=1024))
    assert result.components == {"math": 1.0, "length": -0.5} and result.total == pytest.approx(0.75)
    with pytest.raises(ValueError, match="unknown RewardSpec keys"):
        RewardSpec.from_dict({"weights": {"math": 1.0}, "max_len": 5})
    with pytest.raises(ValueError, match='length_shape = "quadratic": must be one of'):
        RewardSpec.from_dict({"weights": {"length": 1.0}, "max_tokens": 10, "length_shape": "quadratic"})


def test_score_many_in_threads_matches_sequential():
    reward = compose_rewards(_rule_specs(max_tokens=1000))
    samples = [
        _math_sample(COT_THREE_QUARTERS),
        _math_sample(COT_THREE_QUARTERS, answer="0.5"),
        _math_sample("\\boxed{0.75}", n=990),
        _math_sample("答案是 \\boxed{0.75}"),
    ]
    sequential = reward.score_many(samples)
    assert [r.correct for r in sequential] == [True, False, True, True]
    assert sequential[3].components["language"] == 0.0
    assert reward.score_many(samples, max_workers=2) == sequential
