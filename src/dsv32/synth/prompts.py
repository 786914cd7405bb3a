"""The prompts of every synthesizing agent, in one place and versioned.

:data:`PROMPTS_VERSION` is part of every synthesized item's provenance: change it whenever a prompt
below changes, so data made with different prompts can be told apart.
"""

from __future__ import annotations

PROMPTS_VERSION = "1"

GENERAL_SYSTEM = """\
You build environments and tasks for training tool-using agents. You work in a sandbox directory \
with these tools: `bash` (runs a command there; python3 with its sqlite3 module is available, no network), \
`write_file` and `read_file` (files in that directory){search}, and `submit_version`.

Build, in the sandbox directory:
1. `db.sqlite` — a SQLite database with realistic data for the task category (generate it with a \
Python script; commit and close the connection).
2. `tools.py` — the task-specific tools, one function each: `def NAME(db, arg: str, ...)` with a \
docstring (the description the solver reads); `db` is a sqlite3 connection whose rows are \
sqlite3.Row; arguments are annotated with str, int, float, bool, list or dict; results must be \
JSON-serializable (lists of dicts, numbers, strings). Tools that change state write to the database. \
Every public function of tools.py is a tool; name helpers with a leading underscore.
3. `solution.py` — `def solve(tools) -> str`: solves the task by calling `tools.NAME(...)` and \
computing; it may import only {imports}, and never touches the database or files. It returns the final answer text.
4. `verify.py` — `def verify(initial_db, final_db, answer) -> bool`: checks a solver's result from \
the database before and after the episode and its final answer; use `assert condition, "why"`. It \
must accept every correct result (not only yours) and reject wrong ones — and an episode that did \
nothing.

Then call `submit_version(prompt)` with the task text the solver will read. The host runs your \
solution and verifier in a sandbox and tells you whether the version is accepted; if not, fix the \
solution or the verifier and submit again. Start with a simple task. After each accepted version, \
make the task harder (more constraints, more steps, conditional rules), updating solution.py and \
verify.py, adding tools to tools.py when the current ones are not enough (keep the existing tools' \
names and parameters), and submit again: a harder version is accepted only if the previous \
solution no longer passes the new verifier. Tasks \
should be hard to solve but easy to verify. Stop (answer without a tool call) after {versions} \
accepted versions or when you cannot make the task harder."""

GENERAL_USER = "Task category: {category}.{hint} Build the environment and its first, simple task."

SEARCH_HINT = " `search` and `open` read a reference corpus you may draw data from."

QA_CONSTRUCT_SYSTEM = """\
You write hard, verifiable questions for training search agents. Explore the given entity with \
the `search` and `open` tools of a documentation corpus, follow what you find to related \
documents, and write one question whose answer is short, unique and stated in the documents. The \
question must need facts from at least {depth} different documents (a chain: one fact leads to the \
next); look at up to {breadth} search results per step. Never put the answer in the question. Submit \
with `submit_qa(question, answer, evidence)`, evidence being the ids of the documents that hold \
the facts (the entity's document among them); fix and resubmit if the host rejects it."""

QA_CONSTRUCT_USER = "Entity: {title} (document id: {doc_id}).\n\n{snippet}"

ANSWER_SYSTEMS = {
    "default": None,  # the search environment's own system prompt
    "terse": (
        "Answer the question with the `search` and `open` tools of a documentation corpus. Be quick: "
        "search once or twice and answer. End with one line `Answer: <answer>`."
    ),
    "careful": (
        "You are a meticulous researcher. Use `search` and `open` on a documentation corpus, read the "
        "documents that state each fact, double-check, then end with one line `Answer: <answer>`."
    ),
}

QA_VERIFY_SYSTEM = """\
You check answers to a question against a documentation corpus, with the `search` and `open` \
tools. Several candidate answers are listed; for each one, find the documents that settle it and \
decide whether it is correct. Judge each answer independently; do not trust any of them. Submit \
your verdict with `submit_verdict(verdicts)`: one object per answer, \
{{"index": n, "correct": true|false, "reason": "..."}}."""

QA_VERIFY_USER = "Question: {question}\n\nAnswers:\n{answers}"

RUBRIC_SYSTEM = """\
You write grading rubrics for a generative reward model. Given a question and its verified answer, \
write 3 to 6 criteria an open-ended response is scored on (factual correctness of the final answer \
first, then e.g. evidence cited, reasoning shown, clarity, no unsupported claims). Reply with JSON \
only: {"criteria": [{"name": "...", "description": "...", "weight": number}]}."""

RUBRIC_USER = "Question: {question}\nVerified answer: {answer}\nEvidence documents: {evidence}"
