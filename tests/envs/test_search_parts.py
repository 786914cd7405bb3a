"""The search environment's parts: answer normalization, paging, tokenization, BM25 ranking, a
custom JSONL corpus, the standard-library corpus and the reproducibility of question generation."""

import json
import random

import pytest

from dsv32.envs import Episode, Task
from dsv32.envs.search import SearchEnv, generate, load_corpus, shared_index
from dsv32.envs.search.answers import extract, matches, same_value
from dsv32.envs.search.calls import CALLS
from dsv32.envs.search.corpus import CorpusError, Doc, pages
from dsv32.envs.search.index import Index, tokenize


@pytest.mark.parametrize(
    ("final", "gold", "ok"),
    [
        ("Answer: 91", "91", True),
        ("Answer: 91.0", "91", True),
        ("Answer: True", "1", False),  # a bool is not a number
        ("Answer: true", "True", True),
        ("Answer: none", "None", True),
        ("Answer: (2, 28)", "(2, 28)", True),
        ("Answer: 2, 28", "(2, 28)", True),
        ("Answer: [2, 28]", "(2, 28)", False),
        ("Answer: 'a  b'", "'a b'", True),
        ("so \\boxed{\\{x\\}} then \\boxed{xml.dom}", "xml.dom", True),
        ("Answer: XML.DOM", "xml.dom", True),
        ("first Answer: 3\nAnswer: 4", "4", True),
        ("", "4", False),
        ("Answer:", "''", False),
    ],
)
def test_answer_rule(final, gold, ok):
    assert matches(final, gold) is ok


def test_extract_and_same_value():
    assert extract("I think so.\nAnswer: `json`.") == "json"
    assert extract("plain text answer") == "plain text answer"
    assert same_value({"a": [1, 2.0]}, {"a": [1.0, 2]})
    assert not same_value({"a": [True]}, {"a": [1]})


def test_pages_cut_at_line_ends_and_keep_all_text():
    text = "".join(f"line {i} " + "x" * (i % 50) + "\n" for i in range(300)) + "y" * 4500
    parts = pages(text, 1000)
    assert "".join(parts) == text
    assert all(len(p) <= 1000 for p in parts)
    assert all(p.endswith("\n") for p in parts[:-5])
    assert pages("") == [""]


def test_tokenize_splits_identifiers_and_drops_stop_words():
    assert tokenize("OrderedDict.move_to_end is the A") == ["ordereddict", "move_to_end", "move", "end"]


def test_bm25_ranks_the_matching_document_first():
    docs = [
        Doc("a", "apples", "apples are red fruit"),
        Doc("b", "bananas", "bananas are yellow fruit"),
        Doc("c", "cherries", "cherries are small red fruit with stones"),
    ]
    index = Index(docs)
    assert [h.doc.id for h in index.search("yellow", 3)] == ["b"]
    assert index.search("red stones", 3)[0].doc.id == "c"
    assert index.rank("apples", "a") == 1 and index.rank("apples", "b") is None
    assert index.search("the", 3) == []


def test_a_custom_jsonl_corpus_replaces_the_default(tmp_path):
    path = tmp_path / "corpus.jsonl"
    rows = [
        {"id": f"d{i}", "title": f"Town {i}", "text": f"Town {i} has {i * 1000 + 7} inhabitants."}
        for i in range(5)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = SearchEnv(corpus=path)
    env.reset(Task("t", "How many inhabitants has Town 3?", "3007", "search"))
    assert env.call("search", {"query": "town 3 inhabitants", "k": 2}).startswith("[1] id: d3 |")
    assert "3007 inhabitants" in env.call("open", {"doc_id": "d3"})
    assert env.reward(Episode([], "Answer: 3007")).value == 1.0
    assert env.reward(Episode([], "Answer: 3008")).value == 0.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"id": "a", "title": "t"}\n', "needs string fields"),
        ('{"id": "a", "title": "t", "text": "x"}\n{"id": "a", "title": "t", "text": "y"}\n', "duplicate"),
        ("not json\n", "not JSON"),
        ("\n", "empty"),
    ],
)
def test_bad_corpus_files_are_typed_errors(tmp_path, text, message):
    path = tmp_path / "c.jsonl"
    path.write_text(text)
    with pytest.raises(CorpusError, match=message):
        load_corpus(path)
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(tmp_path / "missing.jsonl")


def test_stdlib_corpus_documents_modules_classes_functions_and_methods():
    index = shared_index()
    kinds = {d.meta["kind"] for d in index.docs}
    assert kinds == {"module", "class", "function", "method"}
    dumps = index.by_id["json.dumps"]
    assert "Defined in module: json" in dumps.text and dumps.meta["params"]["indent"] == "None"
    assert index.search("OrderedDict move_to_end", 3)[0].doc.id == "collections.OrderedDict.move_to_end"
    assert all(c.doc_id in index.by_id for c in CALLS)


def test_generation_is_reproducible_and_seeded():
    index = shared_index()
    a = generate(index.docs, index, 10, seed=3)
    b = generate(index.docs, index, 10, seed=3)
    c = generate(index.docs, index, 10, seed=4)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert [t.prompt for t in a] != [t.prompt for t in c]


def test_returns_answers_are_what_the_call_returns():
    index = shared_index()
    for task in generate(index.docs, index, 25, seed=random.Random(7).randint(0, 99)):
        if task.info["kind"] == "returns":
            source = task.info["key"].removeprefix("returns:")
            namespace = {}
            exec(f"import {source.split('(')[0].rsplit('.', 1)[0]}", namespace)
            assert repr(eval(source, namespace)) == task.answer
