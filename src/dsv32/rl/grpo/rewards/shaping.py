"""Shaping rewards for reasoning and agent tasks (paper §3): a length penalty, and a language-
consistency reward, added because RL made the model mix languages in its chains of thought.

Pure functions of the text and token counts; no tokenizer, no extra dependency (scripts come from
``unicodedata`` names).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache

LENGTH_SHAPES = ("overlong", "linear", "none")


def length_penalty(
    num_tokens: int, *, max_tokens: int, shape: str = "overlong", cache_tokens: int | None = None
) -> float:
    """A penalty ≤ 0 for the completion length ``num_tokens`` under the generation budget ``max_tokens``.

    - ``"overlong"`` — DAPO's soft overlong punishment (Yu et al. 2025, Eq. 13), with
      ``L_max = max_tokens`` and ``L_cache = cache_tokens``::

            0                                   if n ≤ L_max − L_cache
            ((L_max − L_cache) − n) / L_cache   if L_max − L_cache < n ≤ L_max   (0 → −1, linear)
            −1                                  if n > L_max

      ``cache_tokens`` defaults to ``max_tokens // 5`` (DAPO: 4096 of 20480).
    - ``"linear"`` — ``−n / L_max``: every token costs the same (−1 at the budget, below −1 past it).
    - ``"none"`` — 0.
    """
    if shape not in LENGTH_SHAPES:
        raise ValueError(f"unknown length penalty shape {shape!r}; known: {list(LENGTH_SHAPES)}")
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0, got {max_tokens}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
    if shape == "none":
        return 0.0
    if shape == "linear":
        return -num_tokens / max_tokens
    cache = max(1, max_tokens // 5) if cache_tokens is None else cache_tokens
    if not 0 < cache <= max_tokens:
        raise ValueError(f"cache_tokens must be in (0, max_tokens={max_tokens}], got {cache}")
    expected = max_tokens - cache
    if num_tokens <= expected:
        return 0.0
    if num_tokens <= max_tokens:
        return (expected - num_tokens) / cache
    return -1.0


# --- language consistency ------------------------------------------------------------------------

# Text that is not prose: fenced and inline code, LaTeX math, URLs, markup tags and special tokens
# (<think>, <｜end▁of▁sentence｜>, DSML), and LaTeX commands (\frac, \boxed) left outside math.
_NOT_PROSE = re.compile(
    r"```.*?(?:```|\Z)"
    r"|`[^`\n]*`"
    r"|\$\$.*?\$\$"
    r"|(?<!\\)\$[^$]+?(?<!\\)\$"
    r"|\\\[.*?\\\]"
    r"|\\\(.*?\\\)"
    r"|https?://\S+"
    r"|</?[A-Za-z｜][^<>\n]{0,200}>"
    r"|\\[A-Za-z]+",
    re.DOTALL,
)
# Scripts whose lone letters are math symbols (x, n, π, …) rather than words; ignored when alone.
_SYMBOL_SCRIPTS = frozenset({"Latin", "Greek", "Cyrillic"})
# Scripts written without spaces, where one character carries about as much as a word elsewhere.
_LOGOGRAPHIC = frozenset({"Han", "Kana", "Hangul", "Thai"})
_ALIASES = {
    "CJK": "Han",
    "IDEOGRAPHIC": "Han",
    "BOPOMOFO": "Han",
    "HIRAGANA": "Kana",
    "KATAKANA": "Kana",
    "KATAKANA-HIRAGANA": "Kana",
    "HANGUL": "Hangul",
}


@lru_cache(maxsize=65536)
def char_script(ch: str) -> str | None:
    """The script of a letter (``"Latin"``, ``"Han"``, ``"Kana"``, ``"Hangul"``, ``"Cyrillic"``,
    ``"Arabic"``, ``"Devanagari"``, ``"Greek"``, ``"Hebrew"``, ``"Thai"``, …: the first word of its
    Unicode name); None for non-letters (digits, punctuation, space) and math alphanumerics."""
    if not unicodedata.category(ch).startswith("L"):
        return None
    words = unicodedata.name(ch, "").split()
    if words and words[0] in ("FULLWIDTH", "HALFWIDTH"):
        words = words[1:]
    if not words or words[0] in ("MATHEMATICAL", "MODIFIER"):
        return None
    return _ALIASES.get(words[0], words[0].title())


def _runs(text: str) -> list[tuple[str, int]]:
    """``(script, length)`` of each maximal run of same-script letters in the prose of ``text``; lone
    Latin/Greek/Cyrillic letters (variables) are dropped."""
    prose = _NOT_PROSE.sub(" ", text)
    runs: list[tuple[str, int]] = []
    current, length = None, 0
    for ch in prose + " ":
        script = char_script(ch)
        if script == current and script is not None:
            length += 1
            continue
        if current is not None and not (length == 1 and current in _SYMBOL_SCRIPTS):
            runs.append((current, length))
        current, length = script, 1
    return runs


def dominant_scripts(text: str) -> frozenset[str]:
    """The script(s) the text is written in: the script with the most words, counting a run of
    letters as one word and each Han/Kana/Hangul/Thai character as one (so a short English
    instruction appended to a long Chinese question does not outvote it). Japanese — Kana making up
    ≥ 10% of the Han + Kana characters — accepts both Han and Kana. Empty when there are no letters."""
    words: Counter[str] = Counter()
    for script, length in _runs(text):
        words[script] += length if script in _LOGOGRAPHIC else 1
    if not words:
        return frozenset()
    top = words.most_common(1)[0][0]
    if top in ("Han", "Kana") and words["Kana"] >= 0.1 * (words["Han"] + words["Kana"]):
        return frozenset({"Han", "Kana"})
    return frozenset({top})


def language_consistency(prompt: str, completion: str, *, scripts: set[str] | None = None) -> float:
    """Share in [0, 1] of the completion's letters written in the prompt's script (:func:`dominant_scripts`,
    or the given ``scripts``). Not counted: digits, punctuation, whitespace, LaTeX (``$…$``, ``\\[…\\]``,
    ``\\frac`` …), code, URLs, tags, lone Latin/Greek/Cyrillic letters. A completion without letters,
    or a prompt without letters (no language to keep), scores 1."""
    target = frozenset(scripts) if scripts is not None else dominant_scripts(prompt)
    if not target:
        return 1.0
    total = matching = 0
    for script, length in _runs(completion):
        total += length
        if script in target:
            matching += length
    return matching / total if total else 1.0
