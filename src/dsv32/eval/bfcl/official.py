"""BFCL's own AST checker (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``), loaded without the
package's heavy imports.

The checker module imports ``bfcl_eval.constants.model_config`` only to ask one thing of a model:
whether BFCL offered it the function names with ``.`` replaced by ``_`` (as it does for every
function-calling model behind an OpenAI-style API, where ``.`` is not allowed in a tool name). That
module imports every model handler BFCL ships (``anthropic``, ``google-genai``, ...), which
``pip install --no-deps bfcl-eval`` leaves out. :func:`ast_checker` executes the checker module's own
file once, as a private module (never entered in ``sys.modules`` under BFCL's name), with a stand-in for
``model_config`` that answers "yes" for :data:`MODEL`, the name the harness grades as; the stand-in is
in ``sys.modules`` only while that module runs its imports, under a lock, and BFCL's real module (if
one was imported) is put back. Everything else the checker imports is BFCL's own (its type converters
for Java and JavaScript included).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from dataclasses import dataclass
from functools import cache
from typing import Any

from dsv32.eval.bfcl.data import data_dir

MODEL = "dsv32-FC"  # a function-calling model, shown BFCL's names with "." as "_"
CHECKER = "bfcl_eval.eval_checker.ast_eval.ast_checker"
MODEL_CONFIG = "bfcl_eval.constants.model_config"
_LOCK = threading.Lock()


@dataclass(frozen=True)
class _ModelConfig:
    underscore_to_dot: bool = True


@cache
def _module() -> types.ModuleType:
    data_dir()  # a clear error when bfcl-eval is not installed
    with _LOCK:
        spec = importlib.util.find_spec(CHECKER)
        if spec is None or spec.loader is None:
            raise ImportError(f"bfcl-eval has no {CHECKER}")
        module = importlib.util.module_from_spec(spec)
        stand_in = types.ModuleType(MODEL_CONFIG)
        stand_in.MODEL_CONFIG_MAPPING = {MODEL.replace("_", "/"): _ModelConfig()}
        saved = sys.modules.get(MODEL_CONFIG)
        sys.modules[MODEL_CONFIG] = stand_in
        try:
            spec.loader.exec_module(module)
        finally:
            if saved is None:
                sys.modules.pop(MODEL_CONFIG, None)
            else:
                sys.modules[MODEL_CONFIG] = saved
    return module


def language(category: str) -> Any:
    """BFCL's ``Language`` of a category (Java, JavaScript, else Python)."""
    from bfcl_eval.constants.enums import Language

    if category.endswith("_javascript"):
        return Language.JAVASCRIPT
    if category.endswith("_java"):
        return Language.JAVA
    return Language.PYTHON


def ast_checker(functions: list[dict], calls: list[dict], truth: list[dict], category: str) -> dict:
    """BFCL's verdict ``{"valid", "error", "error_type"}`` on decoded calls ``[{name: {arg: value}}]``
    (names as the model called them) for an entry of ``category``."""
    return _module().ast_checker(functions, calls, truth, language(category), category, MODEL)
