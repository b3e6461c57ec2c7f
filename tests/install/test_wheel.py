"""A release a user can install by name: ``python -m build`` makes the sdist and, from it, the
wheel, without setuptools warnings, with complete metadata that ``twine check`` passes; the
wheel, installed by name from the folder of the release into a fresh virtualenv (nothing of
the checkout on its path), migrates a database, runs a job and serves the dashboard, and the
sdist installs into another one and runs a job too."""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import URL, Engine, text

from tests.conftest import url_string

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
#: What the release is built from (a copy: the build leaves build/ and egg-info behind).
SOURCES = ("postjob_sa", "setup.cfg", "pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE",
           "MANIFEST.in")

WORKFLOWS = '''
import postjob_sa


@postjob_sa.workflow(name="wheel.hello")
def hello(name: str) -> str:
    return f"hello {name}"
'''


def _run(*argv: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "POSTJOB_DATABASE_URL", "DATABASE_URL")}
    res = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert res.returncode == 0, (argv, res.stdout, res.stderr)
    return res


@dataclass
class Release:
    dist: Path
    sdist: Path
    wheel: Path
    log: str  # what the build printed
    version: str


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    tmp = tmp_path_factory.mktemp("release")
    source = tmp / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    res = _run(sys.executable, "-m", "build", "--outdir", tmp / "dist", source, cwd=tmp)
    [sdist] = (tmp / "dist").glob("postjob_sa-*.tar.gz")
    [wheel] = (tmp / "dist").glob("postjob_sa-*.whl")
    version = wheel.name.split("-")[1]
    return Release(tmp / "dist", sdist, wheel, res.stdout + res.stderr, version)


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        [name] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode())


def test_the_build_warns_of_nothing_and_twine_checks_it(release: Release) -> None:
    assert "would be ignored" not in release.log and "is absent from" not in release.log, (
        release.log[-5000:])
    assert not re.search(r"SetuptoolsDeprecationWarning|Deprecated", release.log), (
        release.log[-5000:])
    _run(sys.executable, "-m", "twine", "check", "--strict", release.sdist, release.wheel,
         cwd=release.dist)


def test_the_metadata_says_what_a_package_index_shows(release: Release) -> None:
    meta = _metadata(release.wheel)
    assert meta["Name"] == "postjob_sa" and meta["Version"] == release.version
    assert "SQLAlchemy" in meta["Summary"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert (meta.get_payload() or "").startswith("# postjob_sa")  # the README, then
    assert meta["License-Expression"] == "MIT" and "LICENSE" in meta.get_all("License-File", [])
    assert meta["Requires-Python"] == ">=3.11"
    classifiers = meta.get_all("Classifier", [])
    for wanted in ("Development Status :: 3 - Alpha", "Framework :: SQLAlchemy",
                   "Programming Language :: Python :: 3.11", "Topic :: Database",
                   "Typing :: Typed"):
        assert wanted in classifiers, classifiers
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL", []))
    assert urls.get("Homepage", "").startswith("https://"), urls
    assert f"## {release.version} " in (meta.get_payload() or "")  # the changelog follows
    extras = set(meta.get_all("Provides-Extra", []))
    assert {"embedded", "web", "metrics", "otel"} <= extras, extras
    with tarfile.open(release.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"CHANGELOG.md", "LICENSE", "README.md", "postjob_sa/sql/schema.sql",
            "postjob_sa/sql/history/pj0007_functions.sql"} <= names
    assert f"## {release.version} " in (ROOT / "CHANGELOG.md").read_text()


def _venv(where: Path) -> Path:
    _run(sys.executable, "-m", "venv", where, cwd=where.parent)
    return where / "bin"


@pytest.fixture
def empty_db(db_url: URL, engine: Engine) -> Iterator[URL]:
    with engine.begin() as conn:  # the database as a new user has it: empty
        conn.execute(text("DROP SCHEMA IF EXISTS postjob CASCADE"))
        conn.execute(text("DROP TABLE IF EXISTS postjob_alembic_version"))
    yield db_url


def _migrate_and_run_a_job(bin_dir: Path, url: URL, engine: Engine, cwd: Path) -> int:
    postjob = [bin_dir / "postjob", "--database-url", url_string(url)]
    assert "migrated from nothing" in _run(*postjob, "db", "migrate", cwd=cwd).stdout
    (cwd / "wheeljobs.py").write_text(WORKFLOWS)
    job_id = _run(*postjob, "job", "enqueue", "--import", "wheeljobs", "wheel.hello", '"wheel"',
                  cwd=cwd).stdout.strip()
    _run(*postjob, "run", "--import", "wheeljobs", "--count", "1", cwd=cwd)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT status::text, results FROM postjob.jobs WHERE id = :i"),
                           {"i": int(job_id)}).one()
    assert tuple(row) == ("ok", ["hello wheel"])
    return int(job_id)


def test_the_wheel_installed_by_name_migrates_runs_a_job_and_serves_the_dashboard(
    release: Release, tmp_path: Path, empty_db: URL, engine: Engine
) -> None:
    names = zipfile.ZipFile(release.wheel).namelist()
    for shipped in ("postjob_sa/alembic/versions/pj0001_schema.py", "postjob_sa/py.typed",
                    "postjob_sa/alembic/script.py.mako", "postjob_sa/web/templates/base.html",
                    "postjob_sa/sql/schema.sql"):
        assert shipped in names, shipped
    assert not [n for n in names if n.startswith(("tests/", "examples/"))]

    bin_dir = _venv(tmp_path / "venv")
    # by name, from the release's folder (its dependencies from the package index)
    _run(bin_dir / "python", "-m", "pip", "install", "-q", "--find-links", release.dist,
         f"postjob_sa[web]=={release.version}", cwd=tmp_path)
    where = _run(bin_dir / "python", "-c", "import postjob_sa; print(postjob_sa.__file__)",
                 cwd=tmp_path).stdout
    assert where.startswith(str(tmp_path / "venv")), where
    job_id = _migrate_and_run_a_job(bin_dir, empty_db, engine, tmp_path)

    postjob = [bin_dir / "postjob", "--database-url", url_string(empty_db)]
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


def test_the_sdist_installs_into_a_clean_venv_and_runs_a_job(
    release: Release, tmp_path: Path, empty_db: URL, engine: Engine
) -> None:
    bin_dir = _venv(tmp_path / "venv")
    _run(bin_dir / "python", "-m", "pip", "install", "-q", release.sdist, cwd=tmp_path)
    version = _run(bin_dir / "python", "-c",
                   "import importlib.metadata as m; print(m.version('postjob_sa'))",
                   cwd=tmp_path).stdout.strip()
    assert version == release.version
    _migrate_and_run_a_job(bin_dir, empty_db, engine, tmp_path)
