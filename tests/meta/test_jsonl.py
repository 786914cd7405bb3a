"""The one JSONL reader of user data files: blank lines skipped, every bad line named as FILE:LINE
in the caller's error class, including lines the JSON parser cannot hold."""

import pytest

from dsv32.envs import EnvError, load_tasks
from dsv32.jsonl import read_jsonl


def test_rows_with_their_line_numbers(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n  \n[2]\n"x"\n')
    assert list(read_jsonl(path, ValueError)) == [(1, {"a": 1}), (4, [2]), (5, "x")]


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{not json", "not JSON (Expecting property name"),
        ('{"a": ' + "1" * 5000 + "}", "not JSON (ValueError: Exceeds the limit"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "not JSON (RecursionError"),
    ],
)
def test_a_bad_line_is_the_callers_error_naming_file_and_line(tmp_path, line, why):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "t1", "prompt": "p"}\n' + line + "\n")
    with pytest.raises(EnvError) as info:
        load_tasks(path)
    assert str(info.value).startswith(f"{path}:2: {why}")


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(read_jsonl(tmp_path / "none.jsonl", ValueError))
