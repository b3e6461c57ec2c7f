"""docs/api.md as Markdown: above each ``::: module`` block (which mkdocstrings renders on the
site), the signature and first sentence of every member it lists, so the page reads as a
reference on GitHub or in an editor too. Generated from the real objects (``inspect``);
``tests/docs/test_api_md.py`` fails when the page and the objects part.

    python -m tests.docs.api_md      # rewrite docs/api.md's generated lists
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"
BEGIN = ("<!-- api-md: generated from the objects by python -m tests.docs.api_md; "
         "tests/docs/test_api_md.py checks it -->")
END = "<!-- api-md: end -->"
_DIRECTIVE = re.compile(r"^::: ([\w.]+)\n((?:    .*\n|\s*\n)*)", re.M)
_GENERATED = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END) + r"\n\n", re.S)


def members(options: str) -> list[str]:
    """The names a directive's ``members:`` option lists (a YAML list, block or inline)."""
    found = re.search(r"(?<!_)members:\s*\[([^\]]*)\]", options)
    if found:
        return [n.strip() for n in found.group(1).split(",") if n.strip()]
    block = re.search(r"^\s+members:\n((?:\s+- \w+\n)+)", options, re.M)
    return re.findall(r"- (\w+)", block.group(1)) if block else []


def _text(rst: str) -> str:
    """reST inline markup as Markdown: ``x`` and :func:`x` become `x`."""
    rst = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", rst)
    return rst.replace("``", "`")


def summary(obj: Any) -> str:
    """The first sentence of the docstring's first paragraph."""
    doc = inspect.getdoc(obj) or ""
    para = " ".join(doc.split("\n\n", 1)[0].split())
    sentence = re.split(r"(?<=[.!?])\s(?=[A-Z`(])", para, maxsplit=1)[0]
    return _text(sentence)


def _default(value: Any) -> str:
    text = repr(value)
    return "…" if " at 0x" in text or len(text) > 40 else text


def signature(obj: Any, *, method: bool = False) -> str:
    """``(a, *, b=None) -> R``: names, defaults and the return annotation as written."""
    sig = inspect.signature(obj)
    parts: list[str] = []
    star = False
    for i, p in enumerate(sig.parameters.values()):
        if method and i == 0 and p.name in ("self", "cls"):
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            star = True
            parts.append("*" + p.name)
        elif p.kind is p.VAR_KEYWORD:
            parts.append("**" + p.name)
        elif p.default is p.empty:
            parts.append(p.name)
        else:
            parts.append(f"{p.name}={_default(p.default)}")
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(sig.parameters) or list(
                sig.parameters.values())[i + 1].kind is not p.POSITIONAL_ONLY):
            parts.append("/")
    ret = sig.return_annotation
    shown = ret if isinstance(ret, str) else inspect.formatannotation(ret)
    arrow = "" if ret is sig.empty else " -> " + re.sub(r"\b_\w+\.", "", shown)  # _history.X: X
    return f"({', '.join(parts)}){arrow}"


def _ours(cls: type, name: str) -> Any:
    """The attribute ``name`` as a postjob_sa class of ``cls``'s MRO defines it, or None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name] if klass.__module__.startswith("postjob_sa") else None
    return None


def _forwarded(fn: Any) -> Any:
    """The method a forwarder calls (AsyncJobQueue's awaitable JobQueue methods take
    ``*args, **kwargs`` and pass them on): its signature is the one to show."""
    for cell in getattr(fn, "__closure__", None) or ():
        inner = cell.cell_contents
        if inspect.isfunction(inner) and inner.__name__ == fn.__name__ and inner is not fn:
            return inner
    return fn


def _class_line(name: str, cls: type) -> str:
    init = _ours(cls, "__init__")
    shown = (init is not None or hasattr(cls, "_fields")) and not issubclass(
        cls, (BaseException, enum.Enum))
    params = list(inspect.signature(cls).parameters) if shown else []
    if shown and not all(p.startswith("_") for p in params):
        head = f"`{name}{signature(cls).removesuffix(' -> None')}`"
    else:
        bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not object)
        head = f"class `{name}({bases})`" if bases else f"class `{name}`"
    text = summary(cls)
    if issubclass(cls, enum.Enum):
        text += " Values: " + ", ".join(f"`{m.value}`" for m in cls) + "."
    return _item(head, text)


def _method_lines(cls: type) -> Iterator[str]:
    for name in sorted(n for n in dir(cls) if not n.startswith("_")):
        attr = _ours(cls, name)
        if attr is None or isinstance(attr, enum.Enum):
            continue
        if isinstance(attr, property):
            yield _item(f"`.{name}` (property)", summary(attr), "    ")
            continue
        fn = attr.__func__ if isinstance(attr, (classmethod, staticmethod)) else attr
        if not inspect.isfunction(fn):
            continue
        prefix = "async " if inspect.iscoroutinefunction(fn) else ""
        sig = signature(_forwarded(fn), method=not isinstance(attr, staticmethod))
        yield _item(f"`{prefix}.{name}{sig}`", summary(fn), "    ")


def _attribute_line(name: str, value: Any) -> str:
    """A constant: its value and the ``#:`` comment above its assignment in the package."""
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("postjob_sa"):
            continue
        try:
            lines = inspect.getsource(module).splitlines()
        except (OSError, TypeError):
            continue
        at = next((i for i, line in enumerate(lines) if line.startswith(f"{name} = ")), None)
        if at is not None:
            break
    else:
        raise LookupError(f"no assignment of {name} in postjob_sa")
    comment: list[str] = []
    while at > 0 and lines[at - 1].startswith("#:"):
        at -= 1
        comment.insert(0, lines[at][2:].strip())
    shown = repr(value) if isinstance(value, (str, int, float)) else type(value).__name__
    return _item(f"`{name}` = `{shown}`", _text(" ".join(comment)))


def _item(head: str, text: str, indent: str = "") -> str:
    return f"{indent}- {head}: {text}" if text else f"{indent}- {head}"


def lines_for(target: str, names: list[str]) -> list[str]:
    module = importlib.import_module(target)
    out: list[str] = []
    for name in names:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            out.append(_class_line(name, obj))
            out.extend(_method_lines(obj))
        elif callable(obj):
            prefix = "async " if inspect.iscoroutinefunction(obj) else ""
            out.append(_item(f"`{prefix}{name}{signature(obj)}`", summary(obj)))
        else:
            out.append(_attribute_line(name, obj))
    return out


def render(page: str) -> str:
    """The page with each directive's generated list in front of it (replacing the old one)."""
    page = _GENERATED.sub("", page)

    def with_list(match: re.Match[str]) -> str:
        names = members(match.group(2))
        if not names:
            return match.group(0)
        return "\n".join([BEGIN, *lines_for(match.group(1), names), END, "", match.group(0)])

    return _DIRECTIVE.sub(with_list, page)


if __name__ == "__main__":
    PAGE.write_text(render(PAGE.read_text()))
