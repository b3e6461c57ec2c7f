"""Installable as users install things: the wheel built from this checkout, installed with
an extra into a fresh virtualenv (nothing of the checkout on its path), migrates a database,
runs a job and serves the dashboard."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, text

from tests.conftest import url_string

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

WORKFLOWS = '''
import postjob_sa


@postjob_sa.workflow(name="wheel.hello")
def hello(name: str) -> str:
    return f"hello {name}"
'''


def _run(*argv: str | Path, cwd: Path, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "POSTJOB_DATABASE_URL", "DATABASE_URL")}
    res = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, (argv, res.stdout, res.stderr)
    return res.stdout


def test_the_wheel_migrates_runs_a_job_and_serves_the_dashboard(
    tmp_path: Path, db_url: URL, engine: Engine
) -> None:
    source = tmp_path / "source"  # a copy: the build leaves build/ and egg-info behind
    shutil.copytree(ROOT / "postjob_sa", source / "postjob_sa",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", source,
         cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("postjob_sa-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in ("postjob_sa/alembic/versions/pj0001_schema.py", "postjob_sa/py.typed",
                    "postjob_sa/alembic/script.py.mako", "postjob_sa/web/templates/base.html"):
        assert shipped in names, shipped
    assert not [n for n in names if n.startswith(("tests/", "examples/"))]

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[web]", cwd=tmp_path)
    where = _run(venv / "bin" / "python", "-c", "import postjob_sa; print(postjob_sa.__file__)",
                 cwd=tmp_path)
    assert where.startswith(str(venv)), where

    with engine.begin() as conn:  # the database as a new user has it: empty
        conn.execute(text("DROP SCHEMA postjob CASCADE"))
        conn.execute(text("DROP TABLE IF EXISTS postjob_alembic_version"))
    postjob = [venv / "bin" / "postjob", "--database-url", url_string(db_url)]
    assert "migrated from nothing" in _run(*postjob, "db", "migrate", cwd=tmp_path)

    (tmp_path / "wheeljobs.py").write_text(WORKFLOWS)
    job_id = _run(*postjob, "job", "enqueue", "--import", "wheeljobs", "wheel.hello", '"wheel"',
                  cwd=tmp_path).strip()
    _run(*postjob, "run", "--import", "wheeljobs", "--count", "1", cwd=tmp_path)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT status::text, results FROM postjob.jobs WHERE id = :i"),
                           {"i": int(job_id)}).one()
    assert tuple(row) == ("ok", ["hello wheel"])

    web = subprocess.Popen([str(a) for a in (*postjob, "web", "--port", "0")], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert web.stdout is not None
        address = re.search(r"on (http://\S+/)", web.stdout.readline())
        assert address, web.stderr.read() if web.poll() is not None else "no address"
        with urllib.request.urlopen(f"{address.group(1)}jobs/{job_id}", timeout=30) as page:
            assert page.status == 200 and "wheel.hello" in page.read().decode()
    finally:
        web.terminate()
        web.communicate(timeout=30)
