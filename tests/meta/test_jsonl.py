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


def test_a_line_that_is_not_utf8_is_the_callers_error_naming_file_and_line(tmp_path):
    from dsv32.jsonl import read_log

    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b'{"id": "t1", "prompt": "p"}\n{"id": "t2", "prompt": "\xff"}\n')
    with pytest.raises(EnvError, match=r"tasks\.jsonl:2: not JSON \(UnicodeDecodeError: 'utf-8' codec"):
        load_tasks(path)
    with pytest.raises(EnvError, match=r"tasks\.jsonl:2: not JSON \(UnicodeDecodeError: .*\); use --fresh$"):
        read_log(path, EnvError, "use --fresh")


def test_a_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(read_jsonl(tmp_path / "none.jsonl", ValueError))


def test_a_log_drops_and_cuts_off_an_interrupted_last_row(tmp_path):
    from dsv32.jsonl import read_log

    path = tmp_path / "log.jsonl"
    assert read_log(path, ValueError, "hint") == []
    row = '{"text": "a\u2028b"}\n'  # a row may hold unicode line breaks: only \n ends a row
    path.write_text(row + "\n" + '{"done": 1}', encoding="utf-8")  # a complete row whose newline never came
    assert read_log(path, ValueError, "hint") == [{"text": "a\u2028b"}]
    assert path.read_text(encoding="utf-8") == row + "\n"  # the next row starts on its own line


def test_a_bad_row_inside_a_log_is_the_callers_error_with_its_hint(tmp_path):
    from dsv32.jsonl import read_log

    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\n{torn\n{"b": 2}\n')
    with pytest.raises(EnvError, match=r"log\.jsonl:2: not JSON \(.*\); use --fresh$"):
        read_log(path, EnvError, "use --fresh")
