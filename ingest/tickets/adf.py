"""Atlassian Document Format (Jira Cloud REST v3 bodies) as plain text.

An ADF document is a tree of nodes, `{"type": "doc", "content": [{"type": "paragraph",
"content": [{"type": "text", "text": "..."}]}]}`. Paragraphs and headings become lines with a
blank line after, lists "- "/"1. " items, tables " | "-separated rows; mentions, emoji,
status lozenges and link cards their text. Block quotes are left out, like quoted mail in
HTML bodies: in a ticket they are the message being replied to. Media (attachments) carry
no text. Unknown node types contribute their children's text, so a new node type degrades
instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_DEPTH = 64  # deeper nesting is no honest document; what lies below it is left out

_SKIPPED = frozenset({"blockquote", "media", "mediaGroup", "mediaSingle", "mediaInline"})
_BLOCKS = frozenset({"paragraph", "heading", "codeBlock", "panel", "expand", "nestedExpand"})


def adf_to_text(document: object) -> str:
    """The visible text of an ADF document (or of any node of one)."""
    return _render(document, 0).strip()


def _render(node: object, depth: int) -> str:
    if not isinstance(node, dict) or depth > MAX_DEPTH:
        return ""
    kind = node.get("type")
    if not isinstance(kind, str) or kind in _SKIPPED:
        return ""
    special = _RENDERERS.get(kind)
    if special is not None:
        return special(node, depth)
    text = _children(node, depth)
    return f"{text.strip()}\n\n" if kind in _BLOCKS else text


def _content(node: dict[str, Any]) -> list[Any]:
    content = node.get("content")
    return content if isinstance(content, list) else []


def _children(node: dict[str, Any], depth: int) -> str:
    return "".join(_render(child, depth + 1) for child in _content(node))


def _attr(node: dict[str, Any], *names: str) -> str:
    attrs = node.get("attrs")
    if isinstance(attrs, dict):
        for name in names:
            if isinstance(value := attrs.get(name), str) and value:
                return value
    return ""


def _text(node: dict[str, Any], depth: int) -> str:
    """A text node; a link mark adds its URL, as links do in HTML bodies."""
    text = node.get("text")
    if not isinstance(text, str):
        return ""
    marks = node.get("marks")
    for mark in marks if isinstance(marks, list) else []:
        if isinstance(mark, dict) and mark.get("type") == "link":
            href = _attr(mark, "href")
            return f"{text} ({href})" if href and href != text else text
    return text


def _list(node: dict[str, Any], depth: int) -> str:
    order = node.get("attrs", {}).get("order") if isinstance(node.get("attrs"), dict) else None
    start = order if isinstance(order, int) else 1
    items = [_render(item, depth + 1).strip().replace("\n", "\n   ") for item in _content(node)]
    if node.get("type") == "orderedList":
        return "".join(f"{start + index}. {item}\n" for index, item in enumerate(items)) + "\n"
    return "".join(f"- {item}\n" for item in items) + "\n"


def _table(node: dict[str, Any], depth: int) -> str:
    rows = [row for row in _content(node) if isinstance(row, dict)]
    lines = [" | ".join(_render(cell, depth + 2).strip() for cell in _content(row)) for row in rows]
    return "\n".join(lines) + "\n\n"


_RENDERERS: dict[str, Callable[[dict[str, Any], int], str]] = {
    "text": _text,
    "hardBreak": lambda node, depth: "\n",
    "rule": lambda node, depth: "\n",
    "mention": lambda node, depth: _attr(node, "text"),
    "emoji": lambda node, depth: _attr(node, "text", "shortName"),
    "status": lambda node, depth: _attr(node, "text"),
    "inlineCard": lambda node, depth: _attr(node, "url"),
    "blockCard": lambda node, depth: _attr(node, "url") + "\n\n",
    "bulletList": _list,
    "orderedList": _list,
    "table": _table,
}
