"""Programmatic environment synthesis without writing anything: the vocabulary, 600 drawn environments
(distinct toolsets, every domain, deterministic by seed), and the domain-level split."""

from __future__ import annotations

import dataclasses

import pytest

from dsv32.synth.programmatic import (
    Card,
    SplitError,
    card_of,
    check_disjoint,
    draw_environments,
    split_domains,
    split_environments,
)
from dsv32.synth.programmatic.domains import DOMAIN_NAMES, DOMAINS
from dsv32.synth.programmatic.tasks import TEMPLATES
from dsv32.synth.programmatic.vocab import check_vocabulary, nouns
from dsv32.synth.records import SynthError


@pytest.fixture(scope="module")
def six_hundred():
    return draw_environments(600, seed=0)


def test_the_vocabulary_has_twenty_domains_whose_table_nouns_are_their_own():
    assert len(DOMAINS) >= 20
    for wanted in ("clinic", "library", "warehouse", "airline", "courses", "payroll", "hotel", "bike rental",
                   "theatre", "farm", "restaurant", "gym", "museum", "shipping", "pharmacy", "car dealer",
                   "school", "conference", "bakery", "zoo"):  # fmt: skip
        assert wanted in DOMAIN_NAMES
    clinic = next(d for d in DOMAINS if d.name == "clinic")
    library = next(d for d in DOMAINS if d.name == "library")
    clash = dataclasses.replace(library, item=dataclasses.replace(library.item, nouns=nouns("physician")))
    assert "physician" in clinic.table_nouns()
    with pytest.raises(SynthError, match="physician"):
        check_vocabulary(tuple(clash if d is library else d for d in DOMAINS))
    with pytest.raises(SynthError, match="at least 20"):
        check_vocabulary(DOMAINS[:19])


def test_six_hundred_environments_have_distinct_toolsets_of_three_to_eight_tools(six_hundred):
    assert len({e.signature for e in six_hundred}) == 600
    assert len({e.signature_hash for e in six_hundred}) == 600
    assert {e.domain for e in six_hundred} == set(DOMAIN_NAMES)
    for env in six_hundred:
        assert 3 <= len(env.tools) <= 8
        assert len({t.name for t in env.tools}) == len(env.tools)
        kinds = {t.kind for t in env.tools}
        assert len(env.tasks) == 2 and all(set(TEMPLATES[t.template][0]) <= kinds for t in env.tasks)
    # two environments of one domain are named differently: tables, columns, tools
    for domain in DOMAIN_NAMES:
        mine = [e for e in six_hundred if e.domain == domain]
        tables = {tuple(t.name for t in e.world.tables.values()) for e in mine}
        columns = {tuple(c for t in e.world.tables.values() for c in t.columns.values()) for e in mine}
        assert len(tables) >= len(mine) // 3 and len(columns) >= len(mine) * 3 // 4, domain


def test_drawing_is_deterministic_by_seed_and_a_prefix_of_a_longer_draw(six_hundred):
    def fingerprint(env):
        return (env.id, env.signature, [t.prompt for t in env.tasks], [t.solution for t in env.tasks],
                [t.rows for t in env.world.tables.values()], [t.description for t in env.tools])  # fmt: skip

    again = draw_environments(40, seed=0)
    assert [fingerprint(e) for e in again] == [fingerprint(e) for e in six_hundred[:40]]
    other = draw_environments(40, seed=1)
    assert {e.signature for e in other}.isdisjoint({e.signature for e in again})


def test_prompts_say_what_to_reply_and_name_statuses_as_the_tools_take_them():
    for env in draw_environments(60, seed=3):
        for task in env.tasks:
            assert "reply" in task.prompt.lower() or "answer" in task.prompt.lower(), task.prompt
            assert "{" not in task.prompt and "}" not in task.prompt, task.prompt
            if task.template == "cancel_above":
                open_, _, cancelled = env.world.statuses
                assert f" {open_} " in task.prompt and f" {cancelled}" in task.prompt


def test_the_default_split_holds_out_whole_domains_and_nothing_of_them_leaks(six_hundred):
    split = split_domains(DOMAIN_NAMES, seed=0)
    assert set(split.train) | set(split.heldout) == set(DOMAIN_NAMES)
    assert not set(split.train) & set(split.heldout) and len(split.heldout) == round(0.2 * len(DOMAIN_NAMES))
    train, heldout = split_environments([card_of(e) for e in six_hundred], split)
    assert len(train) + len(heldout) == 600 and heldout
    held_tables = set().union(*(c.tables for c in heldout))
    held_tools = set().union(*(c.tools for c in heldout))
    for card in train:
        assert card.domain not in split.heldout
        assert not card.tables & held_tables and not card.tools & held_tools
    assert split_domains(DOMAIN_NAMES, seed=0) == split
    chosen = split_domains(DOMAIN_NAMES, heldout=["zoo", "farm"])
    assert chosen.heldout == ("farm", "zoo") and "zoo" not in chosen.train


def test_the_split_refuses_any_overlap_and_impossible_splits():
    held = Card("h", "zoo", frozenset({"animals"}), frozenset({"find_animal"}))
    ok = Card("t", "clinic", frozenset({"doctors"}), frozenset({"find_doctor"}))
    check_disjoint([ok], [held])
    leaks = {
        "held-out table": dataclasses.replace(ok, tables=frozenset({"doctors", "animals"})),
        "held-out tool": dataclasses.replace(ok, tools=frozenset({"find_animal"})),
        "held-out domain": dataclasses.replace(ok, domain="zoo"),
        "after held-out domain": dataclasses.replace(ok, tools=frozenset({"list_zoo_keepers"})),
    }
    for what, card in leaks.items():
        with pytest.raises(SplitError, match=what):
            check_disjoint([card], [held])
    with pytest.raises(SplitError, match="not among"):
        split_domains(DOMAIN_NAMES, heldout=["moon base"])
    with pytest.raises(SplitError, match="both sides"):
        split_domains(["zoo"], heldout=["zoo"])
    with pytest.raises(SplitError, match="fraction"):
        split_domains(DOMAIN_NAMES, fraction=1.5)


def test_bad_requests_are_typed_errors():
    with pytest.raises(SynthError, match="at least 1"):
        draw_environments(0, seed=0)
    with pytest.raises(SynthError, match=r"1\.\.4"):
        draw_environments(3, seed=0, tasks_per_env=9)
