"""Released code, taken from git, for the tests that run it beside this code: its package in a
directory of its own (``git archive``), and how a process of it is started. Without git or the
commit the tests fail: they must not pass by not running."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import URL

from tests.conftest import libpq_url
from tests.reliability.conftest import ROOT


@contextlib.contextmanager
def extracted(commit: str) -> Iterator[Path]:
    """The package of ``commit``, extracted into a temporary directory."""
    with tempfile.TemporaryDirectory(prefix=f"postjob-{commit}-") as target:
        try:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "postjob_sa"],
                                     capture_output=True, timeout=60)
        except FileNotFoundError:
            pytest.fail(f"git is not installed: the test takes the released code (commit "
                        f"{commit}) from the repository with git archive")
        if archive.returncode != 0:
            pytest.fail(f"cannot take the released code (commit {commit}) from {ROOT}: "
                        f"{archive.stderr.decode(errors='replace').strip()} (a full clone of the "
                        "repository is needed)")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(target, filter="data")
        yield Path(target)


def released_env(released: Path, url: URL) -> dict[str, str]:
    """The environment of a process of the released code, which runs in the directory of that
    code (``python -m`` and ``-c`` put the working directory first on the path): its package
    comes first, then the repository root for the workflow module (tests/reliability/rel_app.py)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(released), str(ROOT)]),
            "REL_APP_URL": libpq_url(url)}


def run_released(released: Path, url: URL, *args: str,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` with the released code first on the path."""
    return subprocess.run([sys.executable, *args], cwd=released, env=released_env(released, url),
                          capture_output=True, text=True, timeout=timeout)
