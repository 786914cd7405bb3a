"""What the swe tests share: a package's source put in a private cache, so nothing is downloaded."""

from __future__ import annotations

from pathlib import Path


def cached_package(tmp_path: Path, monkeypatch, folder: str, files: dict[str, str]) -> Path:
    """``files`` (relative path → text) as the source of ``folder`` (e.g. ``minipkg-0.1``) in a private
    ``DSV32_CACHE_DIR`` under ``tmp_path``; returns the package's root."""
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "cache" / "swe" / "src" / folder
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root
