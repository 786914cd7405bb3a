"""Shared test setup: offline Hugging Face, one torch thread, the trained tool user."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


#: Test folders whose code splits its work by torch's thread count (the CPU DSA kernels and the models
#: that call them): their modules keep torch's threads, so the split is tested.
MANY_THREADS = ("dsa", "model")


@pytest.fixture(scope="module", autouse=True)
def torch_threads(request):
    """Every other module runs torch on one intra-op thread: the tests' models are tiny, and two
    threads spin-waiting on each small kernel cost several times the CPU of one, more so on a shared
    machine. A server a test starts in a subprocess takes the same count (``helpers.remote``)."""
    folder = Path(str(request.path)).parent.name
    if folder in MANY_THREADS:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_thread():
    """One torch intra-op thread for a module of small-model tests: on a shared 2-core machine two
    contended threads decode several times slower than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def trained_tool_user(tmp_path_factory):
    """The tool user (:func:`helpers.agentic.train_tool_user` on tiny-llama), trained once per session.
    Never changed: tests take ``tool_user`` (a private copy) or ``tool_user_dir`` (saved weights)."""
    from helpers.agentic import train_tool_user

    return train_tool_user("tiny-llama", tmp_path_factory.mktemp("tool_user"))


@pytest.fixture
def tool_user(trained_tool_user):
    """A deep copy of the trained tool user: what a test does to its weights, gradients or attributes
    stays in that test."""
    import copy

    return copy.deepcopy(trained_tool_user)


@pytest.fixture(scope="session")
def tool_user_dir(trained_tool_user, tmp_path_factory):
    """The trained tool user's weights and tokenizer saved as a checkpoint directory."""
    path = tmp_path_factory.mktemp("tool_user_model")
    trained_tool_user.model.save_pretrained(path)
    trained_tool_user.tokenizer.save_pretrained(path)
    return path
