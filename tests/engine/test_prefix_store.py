"""A server's prefix cache (:class:`dsv32.engine.prefix.PrefixStore` under a running batch): prompts that
begin as an earlier prompt or conversation run only their new tokens and decode the tokens they decode
without it; the store never holds more than its bound, evicting the least recently used rows."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from helpers.engine import PREFIX_MODELS as MODELS  # noqa: E402
from helpers.engine import tiny_hf, tiny_llama  # noqa: E402

from dsv32.engine.batch import BatchError, RunningBatch, sample_rows  # noqa: E402
from dsv32.engine.prefix import PrefixStore  # noqa: E402
from dsv32.engine.sampling import SamplingParams  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


def decode(model, prompt: list[int], steps: int, store: PrefixStore | None, keep: bool = True) -> list[int]:
    """Greedy ``steps`` tokens of ``prompt`` alone in a running batch (as the server decodes a request);
    with ``keep``, the finished row's entries go to ``store``."""
    batch = RunningBatch(model)
    batch.join(batch.prefill(prompt, 1, steps, store))
    tokens: list[int] = []
    for step in range(steps):
        (token,), _ = sample_rows(batch.logits, [GREEDY], [None])
        tokens.append(token)
        if step < steps - 1:
            batch.step([token])
    if store is not None and keep:
        batch.keep(store, [0], [prompt + tokens[:-1]])
    return tokens


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_conversation_decodes_the_same_tokens_and_prefills_only_its_new_turns(kind):
    model = MODELS[kind]()
    vocab = model.config.vocab_size
    store = PrefixStore(2**30)
    prompt = [5, 9, 12, 40, 7, 3, 22, 17, 31]
    for turn in range(3):
        hits = store.hit_tokens
        cached = decode(model, prompt, 8, store)
        assert cached == decode(model, prompt, 8, None)
        if turn:  # everything but this turn's tool result and the last reply token came from the store
            assert store.hit_tokens - hits == len(prompt) - 4
        tool_result = [(7 * turn + j) % (vocab - 3) + 2 for j in range(3)]
        prompt = prompt + cached + tool_result
    # two samples of one prompt (a group): the second takes all but its last token from the store
    hits = store.hit_tokens
    decode(model, prompt, 2, store, keep=False)
    decode(model, prompt, 2, store, keep=False)
    assert store.hit_tokens - hits == (len(prompt) - 4) + (len(prompt) - 1)
    # each turn's row begins the next one's: one row is kept
    assert len(store.rows) == 1 and store.nbytes() == store.rows[0].nbytes > 0
    assert 0 < store.hit_rate < 1 and store.hit_tokens == store.reused_tokens


def test_the_store_stays_under_its_bound_evicting_the_least_recently_used():
    model = tiny_llama()
    probe = PrefixStore(2**30)
    decode(model, list(range(10, 30)), 1, probe, keep=False)
    row_bytes = probe.rows[0].nbytes  # 20 tokens
    store = PrefixStore(3 * row_bytes)
    prompts = [[100 + i, *range(10, 29)] for i in range(6)]  # 20 tokens each, no shared prefix
    for i, p in enumerate(prompts):
        decode(model, p, 1, store, keep=False)
        assert store.nbytes() <= store.max_bytes
        assert store.nbytes() == sum(r.nbytes for r in store.rows)
        if i:  # the first prompt is used after each other one: never the least recently used
            decode(model, prompts[0], 1, store, keep=False)
    assert store.evicted == 3
    kept = {tuple(r.ids) for r in store.rows}
    assert kept == {tuple(p) for p in (prompts[0], prompts[4], prompts[5])}
    hits = store.hit_tokens
    decode(model, prompts[1], 1, store, keep=False)  # evicted: nothing comes from the store
    assert store.hit_tokens == hits


def test_a_row_larger_than_the_bound_is_never_kept_and_clear_forgets_every_row():
    model = tiny_llama()
    small = PrefixStore(1000)
    assert decode(model, list(range(10, 40)), 4, small) == decode(model, list(range(10, 40)), 4, None)
    assert small.rows == [] and small.nbytes() == 0
    store = PrefixStore(2**30)
    decode(model, list(range(10, 40)), 4, store)
    queries = store.query_tokens
    store.clear()
    assert store.rows == [] and store.nbytes() == 0 and store.query_tokens == queries
    hits = store.hit_tokens
    decode(model, list(range(10, 40)), 4, store)
    assert store.hit_tokens == hits


def test_keep_refuses_ids_that_are_not_what_the_row_holds():
    model = tiny_llama()
    store = PrefixStore(2**30)
    batch = RunningBatch(model)
    batch.add([5, 6, 7], 1, 4)
    batch.step([8])
    with pytest.raises(BatchError, match="hold"):
        batch.keep(store, [0], [[5, 6, 7]])  # the row holds 4 tokens
    batch.keep(store, [0], [[5, 6, 7, 8]])
    assert [r.ids for r in store.rows] == [[5, 6, 7, 8]]


def test_negative_bounds_are_refused():
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixStore(-1)


def test_a_sliding_window_model_runs_without_the_store():
    model = tiny_hf("mistral", sliding_window=8)
    store = PrefixStore(2**30)
    prompt = list(range(10, 30))
    assert decode(model, prompt, 3, store) == decode(model, prompt, 3, None)
    assert store.rows == [] and store.query_tokens == 0


def test_prompts_prefilled_together_share_the_store_and_its_accounting_holds():
    model = tiny_llama()
    store = PrefixStore(2**30)
    a, b = list(range(10, 40)), list(range(50, 62))
    decode(model, a[:20], 2, store)  # a's first 20 tokens are kept
    batch = RunningBatch(model)
    batch.join(batch.prefill_many([a, a, b], [1, 1, 2], [3, 3, 3], store))
    # each copy of a takes 20 tokens from the store; the next 9 run once and serve both copies; b and
    # every row's last token run
    assert store.query_tokens == 20 + (30 + 30 + 12)
    assert store.hit_tokens == 2 * 20 + 9
    assert store.nbytes() == sum(r.nbytes for r in store.rows)
    assert sorted(len(r.ids) for r in store.rows) == [12, 21, 30]  # a[:20] and its reply token stays
    tokens, _ = sample_rows(batch.logits, [GREEDY] * 4, [None] * 4)
    assert tokens[:2] == [decode(model, a, 1, None)[0]] * 2 and tokens[2] == tokens[3]
