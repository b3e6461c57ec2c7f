"""No SQL is built with string formatting anywhere in the package: every .py under
postjob_sa/ is parsed with ``ast``, and an f-string, a ``%`` format or a ``.format()`` call
whose text looks like SQL fails the test. Statements are literals; values are bound
parameters; the one identifier taken from input (``postjob db grant ROLE``) is quoted by the
server (``format('%I', :role)``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "postjob_sa"

KEYWORDS = ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "DROP", "GRANT",
            "REVOKE", "TRUNCATE", "EXECUTE", "PREPARE", "LISTEN", "NOTIFY", "COPY", "WHERE")
#: Upper-case keywords as words (this code base writes SQL in upper case) ...
_UPPER = re.compile(r"\b(" + "|".join(KEYWORDS) + r")\b")
#: ... and SQL shapes in any case.
_SHAPES = re.compile(
    r"\bselect\b.*\bfrom\b|\binsert\s+into\b|\bupdate\b.+\bset\b|\bdelete\s+from\b"
    r"|\b(create|alter|drop)\s+(table|schema|function|index|database|role|type|sequence"
    r"|trigger|view|extension)\b|\bgrant\b.+\bto\b|\brevoke\b.+\bfrom\b|\btruncate\s+table\b",
    re.IGNORECASE | re.DOTALL,
)


def looks_like_sql(fragment: str) -> bool:
    return bool(_UPPER.search(fragment) or _SHAPES.search(fragment))


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values
                       if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return None


def string_built_sql(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, kind) of each f-string, % format or .format() call that builds SQL."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.JoinedStr) and any(
            isinstance(v, ast.FormattedValue) for v in node.values
        ):
            text = _literal_text(node)
            if text is not None and looks_like_sql(text):
                found.append((node.lineno, "f-string"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            text = _literal_text(node.left)
            if text is not None and looks_like_sql(text):
                found.append((node.lineno, "% format"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("format", "format_map")):
            text = _literal_text(node.func.value)
            if text is not None and looks_like_sql(text):
                found.append((node.lineno, ".format()"))
    return found


@pytest.mark.parametrize(
    "source",
    [
        'q = f"SELECT * FROM t WHERE id = {x}"',
        'q = f"delete from t where id = {x}"',
        'q = "UPDATE t SET a = %s" % (x,)',
        'q = "GRANT USAGE ON SCHEMA postjob TO %(role)s" % {"role": r}',
        'q = "DROP TABLE {}".format(name)',
        'q = "select a from {t}".format_map(m)',
        'cur.execute(f"LISTEN {channel}")',
        'q = f"CREATE ROLE {name}"',
    ],
)
def test_the_guard_catches_planted_examples(source: str) -> None:
    assert string_built_sql(source), source


@pytest.mark.parametrize(
    "source",
    [
        'q = "SELECT * FROM t WHERE id = %(id)s"',  # a literal with placeholders: fine
        'cur.execute("SELECT 1 WHERE a = %s", (x,))',
        'msg = f"job {job_id} will run as soon as a worker is free"',
        'msg = f"cannot update the job {i}: it is final"',  # prose, not SQL
        'msg = "%d of %d running jobs lost their lease" % (a, b)',
        'q = sql.SQL("GRANT USAGE ON SCHEMA postjob TO {}").format(sql.Identifier(r))',
    ],
)
def test_the_guard_lets_safe_code_pass(source: str) -> None:
    assert string_built_sql(source) == []


def test_no_sql_is_built_with_string_formatting_in_the_package() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    offences = [f"{path.relative_to(PACKAGE.parent)}:{line}: {kind} builds SQL"
                for path in files
                for line, kind in string_built_sql(path.read_text(), str(path))]
    assert offences == [], "\n".join(offences)
