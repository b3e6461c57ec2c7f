"""The embedded server: a predictable data directory and a clear message without the extra."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from postjob_sa import embedded


def test_data_dir_is_predictable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POSTJOB_EMBEDDED_DIR", str(tmp_path / "pg"))
    assert embedded.data_dir() == tmp_path / "pg"
    monkeypatch.delenv("POSTJOB_EMBEDDED_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert embedded.data_dir() == tmp_path / "xdg" / "postjob_sa" / "pgdata"


def test_without_the_extra_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "_server", None)
    monkeypatch.setitem(sys.modules, "pgserver", None)  # as if not installed: import fails
    with pytest.raises(embedded.EmbeddedUnavailable) as err:
        embedded.database_url()
    assert "pip install 'postjob_sa[embedded]'" in str(err.value)
    assert "--database-url" in str(err.value)
