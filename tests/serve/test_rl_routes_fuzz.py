"""The RL routes of ``dsv32 serve`` under hostile bodies (hypothesis): ``/inference/v1/generate``,
``/update_weights``, ``/pause`` and ``/resume``, ``/init_weight_transfer_engine``. Whatever arrives —
wrong types, out-of-range numbers, NaN, lone surrogates, strings for integers, ragged or mixed token
lists, bodies that are not JSON objects — the answer is never a 5xx, every 4xx is OpenAI's error
JSON, and the server serves a generate request after each."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def server(one_thread):
    from dsv32.serve import ServerThread, create_app, load_served

    app = create_app(load_served("tiny-llama", device="cpu"), max_batch=4, rl_routes=True)
    with ServerThread(app) as server:
        server.root = server.base_url.removesuffix("/v1")
        yield server


# ---------------------------------------------------------------------- strategies
TEXT = st.one_of(st.text(max_size=6), st.sampled_from(["\ud800", "a\udfffb", "", "1", "tiny-llama "]))
NON_NUMBER = st.one_of(
    st.booleans(),
    TEXT,
    st.lists(st.integers(-3, 3), max_size=2),
    st.dictionaries(TEXT, st.integers(), max_size=2),
)
NON_STRING = st.one_of(st.booleans(), st.integers(), st.floats(), st.lists(TEXT, max_size=2))
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
BIG_INTS = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30]))
ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), BIG_INTS, FLOATS, TEXT),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def _maybe(fields: dict) -> st.SearchStrategy[dict]:
    """Objects holding any subset of ``fields`` (each drawn from its strategy)."""
    return st.fixed_dictionaries({}, optional=fields)


PROMPT = st.lists(st.integers(0, 50), min_size=1, max_size=4)
TOKEN_IDS = st.one_of(
    PROMPT,
    st.lists(PROMPT, min_size=1, max_size=3),  # a batch, ragged or not
    st.lists(st.one_of(BIG_INTS, FLOATS, TEXT, st.booleans(), PROMPT), max_size=4),  # mixed, out of range
    st.lists(st.lists(st.one_of(st.integers(-5, 300), TEXT, FLOATS), max_size=3), max_size=3),
    ANY,
)
SAMPLING = st.one_of(
    _maybe(
        {
            # a valid max_tokens stays small (a run decodes it); the others are refused before decoding
            "max_tokens": st.one_of(
                st.integers(1, 3), st.integers(-(2**70), 0), st.integers(10**6, 2**70), NON_NUMBER
            ),
            "temperature": st.one_of(st.floats(0, 2), FLOATS, NON_NUMBER),
            "top_p": st.one_of(st.floats(0, 1), FLOATS, NON_NUMBER),
            "top_k": st.one_of(st.integers(-10, 400), BIG_INTS, NON_NUMBER),
            "seed": st.one_of(BIG_INTS, st.none(), NON_NUMBER),
            "stop_token_ids": st.one_of(st.lists(st.integers(-5, 300), max_size=3), ANY),
            "logprobs": st.one_of(st.integers(-3, 30), ANY),
            "return_sampling_mask": st.one_of(st.booleans(), ANY),
            "return_routed_experts": st.one_of(st.booleans(), ANY),
            "n": ANY,
        }
    ),
    ANY,
)
GENERATE = st.one_of(
    _maybe(
        {
            "model": st.one_of(st.just("tiny-llama"), TEXT, ANY),
            "sampling_params": SAMPLING,
            "pad_token_id": st.one_of(st.integers(-5, 300), BIG_INTS, ANY),
            "stream": st.one_of(st.booleans(), ANY),
        }
    ).flatmap(lambda rest: TOKEN_IDS.map(lambda ids: {"token_ids": ids, **rest})),
    ANY,
)
UPDATE = st.one_of(
    _maybe(
        {
            # no path here names a weight file: a valid-looking body is refused by what it names
            "path": st.one_of(TEXT, st.sampled_from(["/", "/nonexistent/w.safetensors", "\x00", "."]), ANY),
            "weight_version": st.one_of(BIG_INTS, NON_NUMBER, FLOATS),
            "names": st.one_of(st.lists(TEXT, max_size=3), ANY),
            "dtypes": st.one_of(
                st.lists(st.sampled_from(["float32", "banana", "__class__", ""]), max_size=3), ANY
            ),
            "shapes": st.one_of(st.lists(st.lists(st.integers(-2, 4), max_size=2), max_size=3), ANY),
        }
    ),
    ANY,
)

# /init_weight_transfer_engine: a body the route accepts makes the server join a process group (it
# waits up to its timeout for the trainer), so every body drawn here has at least one field broken.
INIT_VALID = {
    "master_address": st.sampled_from(["127.0.0.1", "localhost"]),
    "master_port": st.integers(1, 65535),
    "backend": st.sampled_from([None, "gloo", "nccl"]),
    "timeout": st.floats(0.01, 1.0),
}
INIT_BROKEN = {
    "master_address": st.one_of(
        st.sampled_from(["", "a b", "\x00", "\ud800", "x" * 300, "host/path", "127.0.0.1\n"]), NON_STRING
    ),
    "master_port": st.one_of(st.sampled_from([0, -1, 65536, 2**70]), FLOATS, NON_NUMBER),
    "backend": st.one_of(st.sampled_from(["mpi", "", "GLOO", "ucc"]), st.integers(), st.booleans()),
    "timeout": st.one_of(st.sampled_from([0.0, -1.0, 600.5, 1e9]), st.just(float("nan")), NON_NUMBER),
}


@st.composite
def init_bodies(draw) -> dict:
    broken = draw(st.sets(st.sampled_from(sorted(INIT_VALID)), min_size=1))
    body = {}
    for name in INIT_VALID:
        if name in broken:
            if name != "master_address" or draw(st.booleans()):  # a missing address is broken too
                body[name] = draw(INIT_BROKEN[name])
        else:
            body[name] = draw(INIT_VALID[name])
    return body


# ---------------------------------------------------------------------- the property
def _post(server, path: str, body, raw: bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()  # NaN, lone surrogates as \\u escapes
    headers = {"content-type": "application/json"}
    return httpx.post(server.root + path, content=content, headers=headers, timeout=60)


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) == ERROR_KEYS and isinstance(error["message"], str), error
        assert error["type"] == "invalid_request_error", error


def _still_serving(server) -> None:
    assert httpx.get(server.root + "/is_paused", timeout=60).json()["is_paused"] is False
    ok = {"token_ids": [104, 105], "sampling_params": {"max_tokens": 2, "temperature": 0}}
    r = httpx.post(server.root + "/inference/v1/generate", json=ok, timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) >= 1


@SETTINGS
@given(body=GENERATE)
@example(body={"token_ids": [1], "sampling_params": {"seed": 2**70}})
@example(body={"token_ids": [1], "sampling_params": {"seed": 2**63}})
@example(body={"token_ids": [1], "sampling_params": {"temperature": float("inf")}})
@example(body={"token_ids": [1], "sampling_params": {"top_p": float("nan")}})
@example(body={"token_ids": [[1, 2], [3]], "pad_token_id": 2**70})
@example(body={"token_ids": [1], "model": "\ud800"})
@example(body={"token_ids": [1], "sampling_params": {"stop_token_ids": [2**64]}})
def test_generate_never_answers_a_hostile_body_with_a_server_error(server, body):
    r = _post(server, "/inference/v1/generate", body)
    _check(r)
    if r.status_code == 200:
        reply = r.json()
        ids = body["token_ids"]
        assert len(reply["choices"]) == (len(ids) if isinstance(ids[0], list) else 1)
    _still_serving(server)


@pytest.mark.parametrize(
    "raw", [b"", b"{", b"[1, 2]", b"null", b'"text"', b"\xff\xfe", b'{"token_ids": [1]} x']
)
def test_bodies_that_are_not_json_objects_are_400(server, raw):
    for path in ("/inference/v1/generate", "/update_weights", "/init_weight_transfer_engine"):
        r = _post(server, path, None, raw=raw)
        _check(r)
        assert r.status_code == 400
    _still_serving(server)


@SETTINGS
@given(body=UPDATE)
@example(body={"path": "\ud800", "weight_version": 1})
@example(body={"path": "/", "weight_version": 1})
@example(body={"weight_version": 2**70, "path": "/x"})
@example(body={"weight_version": 1, "names": ["a"], "dtypes": ["float32"], "shapes": [[-1]]})
def test_update_weights_never_answers_a_hostile_body_with_a_server_error(server, body):
    r = _post(server, "/update_weights", body)
    _check(r)
    assert r.status_code != 200  # nothing here names real weights
    assert httpx.get(server.root + "/weight_info", timeout=60).json()["weight_version"] is None
    _still_serving(server)


@SETTINGS
@given(
    mode=st.one_of(st.sampled_from(["abort", "wait", "keep", "", "WAIT", "wait ", "abort|keep"]), TEXT),
    timeout=st.one_of(
        st.none(),
        st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e-9", "0.5", "600", "601", "1e999", "x"]),
    ),
    body=ANY,
)
def test_pause_and_resume_never_answer_with_a_server_error_and_resume_serves_again(
    server, mode, timeout, body
):
    query = {"mode": mode} | ({} if timeout is None else {"timeout": timeout})
    # quoted by hand: a lone surrogate goes out as its bytes, which no client library would send
    url = (
        server.root
        + "/pause?"
        + "&".join(f"{k}={quote(v.encode('utf-8', 'surrogatepass'))}" for k, v in query.items())
    )
    content = json.dumps(body).encode()
    r = httpx.post(url, content=content, timeout=60)
    _check(r)
    if r.status_code == 200:
        assert r.json()["mode"] == mode and httpx.get(server.root + "/is_paused").json()["is_paused"]
    _check(httpx.post(server.root + "/resume", content=content, timeout=60))
    _still_serving(server)


@SETTINGS
@given(body=init_bodies())
@example(body={"master_address": "127.0.0.1", "master_port": 1, "backend": "gloo", "timeout": float("inf")})
@example(body={"master_address": "\ud800", "master_port": 1, "timeout": 0.1})
def test_init_weight_transfer_never_answers_a_malformed_body_with_a_server_error(server, body):
    r = _post(server, "/init_weight_transfer_engine", body)
    _check(r)
    assert r.status_code == 400
    _still_serving(server)


def test_the_nccl_backend_on_a_cpu_model_is_refused_before_joining(server):
    body = {"master_address": "127.0.0.1", "master_port": 1, "backend": "nccl", "timeout": 60}
    r = _post(server, "/init_weight_transfer_engine", body)
    _check(r)
    assert r.status_code == 400 and r.json()["error"]["param"] == "backend"
