"""Ticket bodies as the text a model should learn from: HTML made plain, and the quoted reply
chain, signature and sign-off an email client appended taken off.

A support thread repeats itself: every email reply carries the whole conversation below it,
and every agent reply ends in the same signature. Left in, a resolution would teach the model
to recite the customer's own message back and sign as "Anna, Tier 2 Support". What is
stripped, in order:

1. HTML (Zendesk `html_body`, HTML in CSV exports) becomes text; `<blockquote>`, Gmail's
   `gmail_quote`/`gmail_signature` and everything after Outlook's `divRplyFwdMsg` go with it.
2. Lines quoted with ">", with the "On <date>, <name> wrote:" header above them (whether the
   reply sits above or below the quote).
3. From the first of these on, everything: Zendesk's "##- Please type your reply above this
   line -##", a reply header left without ">" quoting (HTML converted mail), "-----Original
   Message-----", an Outlook "From:/Sent:/To:/Subject:" block, the "-- " signature separator,
   "Sent from my iPhone" and its kin.
4. A closing "Best regards,"/"Thanks,"... line when only a few short lines (a name, a title,
   a phone number) follow it.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_BLOCK_TAGS = _words(
    "address article aside dd div dl dt fieldset figcaption figure footer form h1 h2 h3 h4 h5 "
    "h6 header hr li main nav ol p pre section table tbody thead tfoot tr ul"
)
# blocks followed by a blank line
_PARAGRAPH_TAGS = _words("h1 h2 h3 h4 h5 h6 ol p pre table ul")
_SKIPPED_TAGS = frozenset({"blockquote", "head", "script", "style", "template", "title"})
_VOID_TAGS = _words("area base br col embed hr img input link meta param source track wbr")
_SKIPPED_CLASSES = ("gmail_quote", "gmail_signature", "yahoo_quoted", "moz-signature")
_CUT_IDS = frozenset({"divrplyfwdmsg", "x_divrplyfwdmsg", "appendonsend"})
_HTML_HINT = re.compile(
    r"<(?:p|br|div|span|html|body|table|blockquote|ul|ol|li|b|i|strong|em|a|h[1-6])\b[^>]*>",
    re.IGNORECASE,
)


def looks_like_html(text: str) -> bool:
    """Whether a body from a source that does not say (a CSV cell) is HTML."""
    return _HTML_HINT.search(text) is not None


def html_to_text(html: str) -> str:
    """Visible text of an HTML body: blocks on their own lines, lists as "- "/"1. " items,
    links as "text (url)", quoted mail and signatures left out."""
    try:
        return _extract(html)
    except AssertionError:  # html.parser's answer to a marked section it does not know
        return _extract(html.replace("<![", "&lt;!["))


def _extract(html: str) -> str:
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    return _tidy("".join(parser.parts))


class _TextExtractor(HTMLParser):
    """The stdlib parser, collecting text; tolerant of the broken HTML mail clients write."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip_tag: str | None = None  # the element whose whole subtree is left out
        self._skip_depth = 0
        self._is_cut = False  # everything from here on is a quoted chain
        self._pre_depth = 0
        self._lists: list[list[int]] = []  # [next number] for <ol>, [] for <ul>
        self._href: str | None = None
        self._link_text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._is_cut or self._skipping(tag, is_start=True):
            return
        attributes = {name: value or "" for name, value in attrs}
        if attributes.get("id", "").lower() in _CUT_IDS:
            self._is_cut = True
        elif tag not in _VOID_TAGS and (
            tag in _SKIPPED_TAGS or _has_skipped_class(attributes.get("class", ""))
        ):
            self._skip_tag, self._skip_depth = tag, 1
        else:
            self._open(tag, attributes)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self._is_cut and self._skip_tag is None and tag in ("br", "hr"):
            self._newline(is_forced=tag == "br")

    def handle_endtag(self, tag: str) -> None:
        if self._is_cut or self._skipping(tag, is_start=False):
            return
        if tag == "a" and self._href is not None:
            self._close_link()
        elif tag in ("ol", "ul") and self._lists:
            self._lists.pop()
        elif tag == "pre":
            self._pre_depth = max(0, self._pre_depth - 1)
        if tag in ("td", "th"):
            self.parts.append(" ")
        elif tag in _BLOCK_TAGS:
            self._newline()
            if tag in _PARAGRAPH_TAGS:
                self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._is_cut or self._skip_tag is not None:
            return
        if not self._pre_depth:
            data = re.sub(r"\s+", " ", data)
            if not self.parts or self.parts[-1].endswith("\n"):
                data = data.lstrip()
        (self._link_text if self._href is not None else self.parts).append(data)

    def _skipping(self, tag: str, *, is_start: bool) -> bool:
        """Track the depth of the subtree being left out; True while inside it."""
        if self._skip_tag is None:
            return False
        if tag == self._skip_tag and tag not in _VOID_TAGS:
            self._skip_depth += 1 if is_start else -1
            if self._skip_depth == 0:
                self._skip_tag = None
        return True

    def _open(self, tag: str, attributes: dict[str, str]) -> None:
        if tag == "br" or tag in _BLOCK_TAGS:
            self._newline(is_forced=tag == "br")
        if tag == "ol":
            self._lists.append([1])
        elif tag == "ul":
            self._lists.append([])
        elif tag == "li":
            self.parts.append(self._bullet())
        elif tag == "pre":
            self._pre_depth += 1
        elif tag == "a" and attributes.get("href", "").startswith(("http://", "https://")):
            self._href, self._link_text = attributes["href"], []

    def _bullet(self) -> str:
        if not self._lists or not self._lists[-1]:
            return "- "
        number = self._lists[-1][0]
        self._lists[-1][0] += 1
        return f"{number}. "

    def _close_link(self) -> None:
        text = "".join(self._link_text).strip()
        href, self._href = self._href, None
        self.parts.append(text if not text or text == href else f"{text} ({href})")

    def _newline(self, *, is_forced: bool = False) -> None:
        """End the current line: `<br>` always does, a block only when text precedes it."""
        if self._href is not None:
            self._close_link()
        if is_forced or (self.parts and not self.parts[-1].endswith("\n")):
            self.parts.append("\n")


def _has_skipped_class(classes: str) -> bool:
    return any(name in classes for name in _SKIPPED_CLASSES)


_ZENDESK_MARKER = re.compile(r"##-\s*Please type your reply above this line\s*-##", re.I)
# One alternation, so a line is scanned once (this runs on every line of every comment).
_REPLY_HEADER = re.compile(
    r"^(?:On\b.{4,300}\bwrote:"
    r"|Le\b.{4,300}\ba écrit ?:"
    r"|Am\b.{4,300}\bschrieb.{0,120}:"
    r"|El\b.{4,300}\bescribió:"
    r"|在.{4,300}写道[:\uff1a]"
    r"|\d{4}年\d{1,2}月\d{1,2}日.{2,300}[:\uff1a])$",
    re.I,
)
_ORIGINAL_MESSAGE = re.compile(
    r"^-{2,}\s*(?:Original Message|Ursprüngliche Nachricht|Message d'origine)\s*-{2,}$", re.I
)
_MOBILE_FOOTER = re.compile(
    r"^(?:Sent from my \w.*|Sent from (?:Outlook|Mail|Yahoo Mail)\b.*|Get Outlook for \w.*"
    r"|Envoyé de mon \w.*|Von meinem \w.* gesendet|Enviado desde mi \w.*)$",
    re.I,
)
_OUTLOOK_FROM = re.compile(r"^\*?(?:From|De|Von):", re.I)
_OUTLOOK_FIELD = re.compile(
    r"^\*?(?:Sent|Date|To|Cc|Subject|Envoyé|À|Objet|Gesendet|An|Betreff):", re.I
)
_UNDERSCORE_RULE = re.compile(r"^_{10,}$")
_VALEDICTION = re.compile(
    r"^(?:best(?: regards| wishes)?|kind regards|warm regards|warmest regards|regards"
    r"|many thanks|thanks(?: again| so much| a lot)?|thank you(?: so much)?|cheers|sincerely"
    r"|yours(?: sincerely| truly)?|all the best|br|mit freundlichen grüßen|viele grüße|grüße"
    r"|cordialement|bien à vous|saludos|un saludo|atentamente|よろしくお願いします"
    r"|よろしくお願いいたします|谢谢|此致敬礼|此致)[\s,.!\u3002\uff01\u3001]*$",
    re.I,
)
_SIGN_OFF_MAX_LINES = 5
_SIGN_OFF_MAX_CHARS = 60
_SIGN_OFF_MAX_WORDS = 6


def strip_quotes_and_signature(text: str) -> str:
    """The new part of a message: quoted chains, signatures and sign-offs removed."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    lines = _drop_quoted(lines)
    lines = lines[: _cut_index(lines)]
    lines = lines[: _sign_off_index(lines)]
    return _tidy("\n".join(lines))


def _drop_quoted(lines: list[str]) -> list[str]:
    """Lines quoted with ">", and the reply header introducing them."""
    kept: list[str] = []
    for index, line in enumerate(lines):
        if _is_quoted(line):
            continue
        span = _reply_header_span(lines, index)
        if span and _quote_follows(lines, index + span):
            continue
        if index and _reply_header_span(lines, index - 1) == 2 and _quote_follows(lines, index + 1):
            continue  # the second line of a two-line header
        kept.append(line)
    return kept


def _is_quoted(line: str) -> bool:
    return line.lstrip().startswith(">")


def _quote_follows(lines: list[str], start: int) -> bool:
    for line in lines[start:]:
        if line.strip():
            return _is_quoted(line)
    return False


def _reply_header_span(lines: list[str], index: int) -> int:
    """How many lines the reply header starting at `index` spans (Gmail wraps long ones)."""
    line = lines[index].strip()
    if _is_reply_header(line):
        return 1
    following = lines[index + 1].strip() if index + 1 < len(lines) else ""
    if line and following and _is_reply_header(f"{line} {following}") and len(line) < 200:
        return 2
    return 0


def _is_reply_header(line: str) -> bool:
    return _REPLY_HEADER.match(line) is not None


def _cut_index(lines: list[str]) -> int:
    """Where the quoted chain or the signature begins; len(lines) when neither does."""
    for index, line in enumerate(lines):
        stripped = line.strip()
        if (
            _ZENDESK_MARKER.search(line)
            or _ORIGINAL_MESSAGE.match(stripped)
            or _MOBILE_FOOTER.match(stripped)
            or line.rstrip("\r") in ("-- ", "--")
            or _reply_header_span(lines, index)
            or _is_outlook_header(lines, index)
        ):
            return index
    return len(lines)


def _is_outlook_header(lines: list[str], index: int) -> bool:
    """A "From: ..." line followed by the other header fields Outlook writes above a quote
    (or the underscore rule Outlook puts right before them)."""
    line = lines[index].strip()
    if _UNDERSCORE_RULE.match(line):
        return index + 1 < len(lines) and _is_outlook_header(lines, index + 1)
    if not _OUTLOOK_FROM.match(line):
        return False
    fields = [candidate.strip() for candidate in lines[index + 1 : index + 5] if candidate.strip()]
    return sum(bool(_OUTLOOK_FIELD.match(candidate)) for candidate in fields) >= 2


def _sign_off_index(lines: list[str]) -> int:
    """Where a closing "Best regards," begins, when all that follows it is a few lines that
    read like a name, a title or a phone number rather than sentences."""
    tail = [index for index, line in enumerate(lines) if line.strip()][-_SIGN_OFF_MAX_LINES - 1 :]
    for position, index in enumerate(tail):
        if _VALEDICTION.match(lines[index].strip()) and all(
            _is_signature_line(lines[after].strip()) for after in tail[position + 1 :]
        ):
            return index
    return len(lines)


def _is_signature_line(line: str) -> bool:
    words = len(line.split())
    is_sentence = line.endswith((".", "?", "!", ":")) and words >= 3
    return len(line) <= _SIGN_OFF_MAX_CHARS and words <= _SIGN_OFF_MAX_WORDS and not is_sentence


def clean_text(text: str) -> str:
    """What PostgreSQL and the value checks accept: no NUL, no lone surrogates, no BOMs."""
    text = text.replace("\x00", "").replace("\ufeff", "")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def body_text(raw: str, *, is_html: bool) -> str:
    """A ticket body as training text: plain, its quotes and signature stripped."""
    text = html_to_text(raw) if is_html else raw
    return strip_quotes_and_signature(clean_text(text))


def _tidy(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\xa0", " ").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
