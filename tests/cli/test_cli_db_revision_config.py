"""`postjob db revision` with a framework's Alembic configuration: a relative
``script_location`` read from the ini's folder, and one line that says to pass --directory
when the scripts are not where the ini says (Advanced Alchemy sets them in code)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.test_cli_db import assert_bad_input, postjob

ALEMBIC = str(Path(sys.executable).parent / "alembic")

#: The shape of Advanced Alchemy's alembic.ini: a relative script_location that its own code
#: replaces (AlembicAsyncConfig(script_location=...)), no URL.
FRAMEWORK_INI = """\
[alembic]
prepend_sys_path = src:.
script_location = migrations
file_template = %%(year)d-%%(month).2d-%%(day).2d_%%(slug)s_%%(rev)s
version_path_separator = os
output_encoding = utf-8
"""


def scripts(folder: Path) -> Path:
    """An Alembic scripts folder (the installed Alembic's async template) at ``folder``."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([ALEMBIC, "init", "-t", "async", folder.name], cwd=folder.parent,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    (folder.parent / "alembic.ini").unlink()  # the framework's own ini stands in for it
    return folder


def test_relative_script_location_is_read_from_the_ini_folder(tmp_path: Path) -> None:
    app = tmp_path / "app"
    scripts(app / "migrations")
    (app / "alembic.ini").write_text(FRAMEWORK_INI)
    res = postjob("db", "revision", "--alembic-ini", str(app / "alembic.ini"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    written = list((app / "migrations" / "versions").glob("*.py"))
    assert len(written) == 1
    assert "postjob schema nothing ->" in res.stdout


def test_scripts_set_in_code_need_directory(tmp_path: Path) -> None:
    scripts(tmp_path / "src" / "app" / "db" / "migrations")
    (tmp_path / "alembic.ini").write_text(FRAMEWORK_INI)
    res = postjob("db", "revision", cwd=tmp_path)
    assert_bad_input(res, "no Alembic scripts at", "migrations", "--directory")

    res = postjob("db", "revision", "--alembic-ini", "alembic.ini",
                  "--directory", "src/app/db/migrations", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert len(list((tmp_path / "src" / "app" / "db" / "migrations" / "versions").glob("*.py"))) == 1
