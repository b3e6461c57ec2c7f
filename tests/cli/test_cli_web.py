"""`postjob web`: the dashboard's own server, as a user starts it."""

from __future__ import annotations

import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from sqlalchemy import URL

from tests.cli.test_cli_db import POSTJOB, assert_bad_input, postjob
from tests.conftest import url_string


def _serve(db_url: URL, *args: str, token: str | None = None) -> Iterator[tuple[str, str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("POSTJOB_WEB_TOKEN", "DATABASE_URL")}
    if token is not None:
        env["POSTJOB_WEB_TOKEN"] = token
    proc = subprocess.Popen(
        [POSTJOB, "--database-url", url_string(db_url), "web", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        address = re.search(r"on (http://\S+/)", first)
        assert address, (first, second, proc.stderr.read() if proc.poll() is not None else "")
        yield address.group(1), second
    finally:
        proc.terminate()
        proc.communicate(timeout=10)  # reaps it and closes its pipes


def _status(url: str, data: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_without_a_token_it_serves_read_only_and_says_so(db_url: URL, clean: None) -> None:
    for address, note in _serve(db_url):
        assert address.startswith("http://127.0.0.1:")
        assert "read-only" in note and "--token or $POSTJOB_WEB_TOKEN" in note
        assert _status(address) == 200
        assert _status(address + "jobs/1/reset", data=b"csrf=x") == 403


def test_with_a_token_it_says_where_to_log_in(db_url: URL, clean: None) -> None:
    for address, note in _serve(db_url, token="a long enough secret"):
        assert f"log in at {address}login" in note
        assert "a long enough secret" not in note
        assert _status(address + "login") == 200


def test_bad_options_are_one_line_errors(db_url: URL, clean: None) -> None:
    url = url_string(db_url)
    assert_bad_input(postjob("web", "--port", "70000", url=url), "--port")
    assert_bad_input(postjob("web", "--token", "short", url=url), "at least 8 characters")


@pytest.mark.parametrize("flag", ["--read-only"])
def test_read_only_wins_over_a_token(db_url: URL, clean: None, flag: str) -> None:
    for _, note in _serve(db_url, flag, token="a long enough secret"):
        assert "read-only: actions are off" in note
