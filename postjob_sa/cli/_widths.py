"""Fitting a table to the terminal: column widths shared out by water-filling, and text cut
to a width without folding it onto a second line (a name keeps its end, a sentence is cut
between words). Nothing here prints."""

from __future__ import annotations

#: Between two columns of a table with no edges: a space each side and the rule's space.
GAP = 3
ELLIPSIS = "…"


def fit(natural: dict[str, int], width: int, caps: dict[str, int],
        floors: dict[str, int] | None = None) -> dict[str, int]:
    """Column widths for a table ``width`` wide. The columns not in ``caps`` keep their
    natural width; the others share what is left, the narrow ones first (water-filling),
    each at most its natural width and its cap, and never under its floor (floors that do
    not all fit shrink in proportion)."""
    widths = {n: w for n, w in natural.items() if n not in caps}
    left = width - sum(widths.values()) - GAP * (len(natural) - 1)
    flexible = sorted((n for n in natural if n in caps), key=lambda n: natural[n])
    floor = {n: min(natural[n], (floors or {}).get(n, 0)) for n in flexible}
    if sum(floor.values()) > max(left, 0):  # too narrow for every floor: each gives way
        floor = {n: max(f * max(left, 0) // sum(floor.values()), 4) for n, f in floor.items()}
    left -= sum(floor.values())  # reserved: the narrower columns cannot take it
    for i, name in enumerate(flexible):
        left += floor[name]
        share = max(left // (len(flexible) - i), 4)
        widths[name] = min(natural[name], caps[name], max(share, floor[name]))
        left -= widths[name]
    return widths


def cut_left(text: str, width: int) -> str:
    """``text`` in ``width`` characters, its beginning given up ("…orders.send_invoice")."""
    if len(text) <= width:
        return text
    return ELLIPSIS + text[len(text) - width + 1:] if width > 0 else ""


def cut_words(text: str, width: int) -> str:
    """``text`` in ``width`` characters, its end given up: between two words where the cut
    would fall inside one (and the words are not too long to keep any), else anywhere."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    head = text[:width - 1]
    if text[width - 1] != " ":
        space = head.rfind(" ")
        if space >= width // 2:
            head = head[:space]
    return head.rstrip() + ELLIPSIS
