"""A programmatic environment's verifier; ``bundle.with_params`` binds ``json`` and the task's
``PARAMS`` above this text. Standard library only: it runs in the sandbox as ``python -I -S``.

``PARAMS``: ``keys`` (each table's key column), ``change`` (None, an ``update`` of some rows'
columns or an ``insert`` of one row with given values) and ``answer`` (a ``number`` within a
tolerance, the ``new_id`` of the inserted row, or a ``choice``: one value of a column). Every table
of the final database must equal the initial one with exactly that change; an answer must state
the expected number and no other, or name the expected value and no other value of its column."""
# ruff: noqa: F821

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _norm(text):
    return " ".join(re.sub(r"[\W_]+", " ", str(text).casefold()).split())


def _snapshot(db, table, key):
    return {row[key]: dict(row) for row in db.execute(f'SELECT * FROM "{table}"')}


def _check_state(initial_db, final_db):
    """The key of the inserted row (None when the task inserts nothing)."""
    change, new_key = PARAMS["change"], None
    for table, key in PARAMS["keys"].items():
        before, after = _snapshot(initial_db, table, key), _snapshot(final_db, table, key)
        expect = {k: dict(v) for k, v in before.items()}
        if change and change["table"] == table and change["kind"] == "update":
            for row_key, values in change["rows"]:
                expect[row_key].update(values)
        elif change and change["table"] == table and change["kind"] == "insert":
            added = sorted(set(after) - set(before))
            assert len(added) == 1, f"the task adds one row to {table}; {len(added)} were added"
            new_key = added[0]
            for column, value in change["values"].items():
                got = after[new_key][column]
                assert got == value, f"the new row of {table} has {column} = {got!r}, not what the task asks"
            expect[new_key] = after[new_key]
        missing = sorted(set(expect) - set(after), key=str)
        assert not missing, f"rows of {table} were removed (keys {missing[:5]})"
        extra = sorted(set(after) - set(expect), key=str)
        assert not extra, f"rows were added to {table} that the task does not ask for (keys {extra[:5]})"
        wrong = sorted((k for k in expect if after[k] != expect[k]), key=str)
        assert not wrong, f"rows of {table} are not in the state the task asks for (keys {wrong[:5]})"
    return new_key


def _check_answer(initial_db, answer, new_key):
    spec = PARAMS["answer"]
    text = answer if isinstance(answer, str) else ""
    if spec["kind"] in ("number", "new_id"):
        want = new_key if spec["kind"] == "new_id" else spec["value"]
        found = [float(n) for n in _NUMBER.findall(re.sub(r"(?<=\d),(?=\d{3})", "", text))]
        assert found, "the answer states no number"
        tolerance = spec.get("tolerance", 0) + 1e-9
        assert all(abs(n - want) <= tolerance for n in found), "the answer does not state the expected number"
        return
    want = f" {_norm(spec['value'])} "
    said = f" {_norm(text)} "
    assert want in said, "the answer does not name the expected value"
    rest = said.replace(want, " ")
    values = initial_db.execute(f'SELECT DISTINCT "{spec["column"]}" FROM "{spec["table"]}"')
    others = {_norm(v[0]) for v in values} - {_norm(spec["value"])}
    named = sorted(o for o in others if o and f" {o} " in rest)
    assert not named, f"the answer also names {len(named)} other value(s) of {spec['column']}"


def verify(initial_db, final_db, answer):
    new_key = _check_state(initial_db, final_db)
    _check_answer(initial_db, answer, new_key)
    return True
