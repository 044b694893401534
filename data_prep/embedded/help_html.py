"""Parse LibreOffice help pages (the HTML shipped in ``libreoffice-help-*`` Debian packages).

Every translatable paragraph or heading of a help page carries an ``id`` (``par_id3153527``,
``hd_id3145136``, ...) that is identical in every language's copy of the page, so two copies of
one page align paragraph by paragraph through these ids.

Inline platform switches (``<span class="switchinline">``) hold one variant per platform
(``MAC...``, ``default...``); only the ``default`` variant is kept, as the help viewer shows it
on Linux. Block switches (``class="switch"``) contain whole paragraphs with their own ids and
are kept as they are.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

# Tags whose ``id`` marks one translatable unit.
_UNIT_TAGS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6"})
# Ids that mark navigation placeholders, not text.
_SKIP_ID = re.compile(r"^(bm_|lang_id)")
_VOID_TAGS = frozenset(
    {"br", "img", "meta", "link", "input", "hr", "area", "base", "col", "embed", "source", "wbr"}
)
_SPACE = re.compile(r"\s+")


@dataclass
class _Node:
    """One element of a minimal document tree."""

    tag: str
    attrs: dict[str, str]
    children: list[_Node | str] = field(default_factory=list)


class _TreeBuilder(HTMLParser):
    """Build a :class:`_Node` tree, tolerating unclosed tags."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = _Node("#root", {})
        self._stack: list[_Node] = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = _Node(tag, {k: (v or "") for k, v in attrs})
        self._stack[-1].children.append(node)
        if tag not in _VOID_TAGS:
            self._stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._stack[-1].children.append(_Node(tag, {k: (v or "") for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        # Pop to the matching open tag; a stray end tag with no opener is ignored.
        for depth in range(len(self._stack) - 1, 0, -1):
            if self._stack[depth].tag == tag:
                del self._stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self._stack[-1].children.append(data)


def _render(node: _Node | str) -> str:
    """Visible text of a subtree, with inline platform switches resolved to ``default``."""
    if isinstance(node, str):
        return node
    if node.tag == "br":
        return " "
    if node.tag in {"script", "style"}:
        return ""
    children = node.children
    if node.tag == "span" and node.attrs.get("class") == "switchinline":
        variants = [c for c in children if isinstance(c, _Node)]
        default = [c for c in variants if c.attrs.get("id", "").startswith("default")]
        chosen = default or variants[:1]
        return "".join(_render(c) for c in chosen)
    return "".join(_render(c) for c in children)


def normalize_text(text: str) -> str:
    """Unescape leftover entities, drop soft hyphens and zero-width marks, collapse spaces."""
    text = html.unescape(text)
    text = text.replace("\u00ad", "").replace("\u200b", "").replace("\ufeff", "")
    return _SPACE.sub(" ", text).strip()


def _collect(node: _Node, out: dict[str, str], duplicates: set[str]) -> None:
    for child in node.children:
        if isinstance(child, str):
            continue
        unit_id = child.attrs.get("id", "")
        if child.tag in _UNIT_TAGS and unit_id and not _SKIP_ID.match(unit_id):
            text = normalize_text(_render(child))
            if unit_id in out and out[unit_id] != text:
                duplicates.add(unit_id)
            out.setdefault(unit_id, text)
            continue
        _collect(child, out, duplicates)


def parse_help_page(markup: str) -> dict[str, str]:
    """Extract the translatable units of one help page.

    Args:
        markup: The page's HTML source.

    Returns:
        Mapping from unit id to its plain text (markup stripped, entities unescaped,
        whitespace collapsed), in document order. Ids that occur more than once in the page
        with different texts are ambiguous and left out; empty units are kept as ``""``
        so callers can count them.
    """
    builder = _TreeBuilder()
    builder.feed(markup)
    builder.close()
    units: dict[str, str] = {}
    duplicates: set[str] = set()
    _collect(builder.root, units, duplicates)
    for unit_id in duplicates:
        del units[unit_id]
    return units


def align_pages(src_units: dict[str, str], tgt_units: dict[str, str]) -> list[tuple[str, str, str]]:
    """Pair the units of two language copies of one page by their shared ids.

    Args:
        src_units: Units of the source-language page (``parse_help_page`` output).
        tgt_units: Units of the target-language page.

    Returns:
        ``(unit_id, src_text, tgt_text)`` for every id present in both, in source order.
    """
    return [(uid, text, tgt_units[uid]) for uid, text in src_units.items() if uid in tgt_units]
