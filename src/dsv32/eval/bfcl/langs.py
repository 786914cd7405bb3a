"""BFCL's Java and JavaScript categories: how the functions are shown, and reference arguments.

- :func:`language_docs`: the function docs as BFCL shows them to a function-calling model (its
  ``_func_doc_language_specific_pre_processing``): every description ends with the language note
  ("Note that the provided function is in Java 8 SDK syntax.", ... "in Python 3 syntax." for the
  other categories), and in Java and JavaScript every parameter becomes a ``string`` whose
  description says which Java / JavaScript type it holds "in string representation" (array item
  types and JavaScript object schemas move into the description). The model answers with Java or
  JavaScript literals as strings (``"true"``, ``"50L"``, ``"new ArrayList<>(Arrays.asList(...))"``),
  which BFCL's checker converts back with its type converters.
- :func:`literal_candidates`: ways to write a ground-truth value as such a literal; the reference
  answer takes, per call, the first combination BFCL's checker accepts
  (:func:`dsv32.eval.bfcl.single.reference_calls`).
"""

from __future__ import annotations

import copy
import json

#: List types whose items BFCL's converters read back as strings, whatever they hold.
STRING_ITEM_LISTS = {"java": ("Array", "ArrayList"), "javascript": ("array",)}
STRING_ITEMS = ("String", "any", "char")

HINTS = {
    "java": " Note that the provided function is in Java 8 SDK syntax.",
    "javascript": " Note that the provided function is in JavaScript syntax.",
    "python": " Note that the provided function is in Python 3 syntax.",
}


def category_language(category: str) -> str:
    if category.endswith("_javascript"):
        return "javascript"
    if category.endswith("_java"):
        return "java"
    return "python"


def language_docs(functions: list[dict], category: str) -> list[dict]:
    """Copies of ``functions`` as BFCL shows them for ``category`` (see the module docstring)."""
    language = category_language(category)
    out = copy.deepcopy(functions)
    name = {"java": "Java", "javascript": "JavaScript"}.get(language)
    for item in out:
        item["description"] = item.get("description", "") + HINTS[language]
        if name is None:
            continue
        for value in item.get("parameters", {}).get("properties", {}).values():
            kind = value.get("type")
            value.setdefault("description", "")
            if kind == "any":
                value["description"] += (
                    f" This parameter can be of any type of {name} object in string representation."
                )
            else:
                value["description"] += f" This is {name} {kind} type parameter in string representation."
            if kind in (("ArrayList", "Array") if language == "java" else ("array",)):
                value["description"] += (
                    f" The list elements are of type {value['items']['type']};"
                    " they are not in string representation."
                )
                del value["items"]
            if language == "javascript" and kind == "dict" and "properties" in value:
                value["description"] += (
                    " The dictionary entries have the following schema;"
                    " they are not in string representation. " + json.dumps(value["properties"])
                )
                del value["properties"]
            value["type"] = "string"
    return out


def _element(value: object, kind: str, quoted: bool, language: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value) if quoted else value
    if isinstance(value, int) and kind == "long" and language == "java":
        return f"{value}L"
    if isinstance(value, float) and kind == "float" and language == "java":
        return f"{value}f"
    return str(value)


def literal_candidates(value: object, kind: str, language: str) -> list[str]:
    """Literals of ``language`` that may stand for ``value`` as a parameter (``kind``: the type of
    its items, for a list)."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, int):
        return [str(value), f"{value}L", f"{value}n"]
    if isinstance(value, float):
        out = [repr(value), f"{value}f"]
        return [*out, str(int(value))] if value == int(value) else out
    if isinstance(value, str):
        return [value, json.dumps(value)]
    if isinstance(value, list):
        styles = [", ".join(_element(v, kind, quoted, language) for v in value) for quoted in (True, False)]
        if language == "java":
            name = {"long": "Long", "integer": "Integer", "float": "Float", "double": "Double"}.get(
                kind, "String"
            )
            return [
                *(f"new ArrayList<>(Arrays.asList({items}))" for items in styles),
                *(f"new {name}[]{{{items}}}" for items in styles),
            ]
        return [f"[{items}]" for items in styles]
    if isinstance(value, dict):
        if language == "java":
            puts = " ".join(
                f"put({json.dumps(str(k))}, {_element(v, 'any', True, language)});" for k, v in value.items()
            )
            return [f"new HashMap<String, String>() {{{{ {puts} }}}}"]
        return [
            "{" + ", ".join(f"{k}: {_element(v, 'any', quoted, language)}" for k, v in value.items()) + "}"
            for quoted in (True, False)
        ]
    return [str(value)]
