"""The interop package imports without the optional libraries, and says how to install one."""

from __future__ import annotations

import pytest

from dsv32.errors import DSV32Error
from dsv32.interop import InteropError, MissingExtraError
from dsv32.interop.errors import require


def test_a_missing_library_names_the_extra_and_the_no_deps_install():
    with pytest.raises(
        MissingExtraError, match=r"pip install 'dsv32\[lib\]' && pip install --no-deps lib-dist"
    ):
        require("surely_not_an_installed_module", "lib", "lib-dist")
    assert issubclass(MissingExtraError, ImportError) and issubclass(InteropError, DSV32Error)
