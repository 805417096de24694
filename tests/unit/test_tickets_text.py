"""Ticket bodies as training text: HTML and ADF made plain, quoted reply chains, signatures
and sign-offs of the common mail clients taken off, and nothing else touched."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.tickets.adf import adf_to_text
from ingest.tickets.text import (
    body_text,
    clean_text,
    html_to_text,
    looks_like_html,
    strip_quotes_and_signature,
)

REPLY_CASES = {
    "top-posted reply above a '>' quote with its header": (
        "It still fails on Safari.\n\nOn Mon, 4 Mar 2024 at 10:02, Anna Kowalska "
        "<anna@acme.example> wrote:\n> Please clear your cache.\n>\n> Anna",
        "It still fails on Safari.",
    ),
    "bottom-posted reply below the quote": (
        "On Tue, Mar 5, 2024, Kenji wrote:\n> Did that work?\n\nYes, thank you, all good now.",
        "Yes, thank you, all good now.",
    ),
    "Gmail header wrapped over two lines": (
        "Works now.\n\nOn Mon, Mar 4, 2024 at 10:02 AM Anna Kowalska <\nanna@acme.example> wrote:\n"
        "> Try again please.",
        "Works now.",
    ),
    "inline answers between quoted lines": (
        "> Which browser?\nFirefox 124.\n> Which OS?\nUbuntu 22.04.",
        "Firefox 124.\nUbuntu 22.04.",
    ),
    "reply header without quoting (HTML mail made text)": (
        "Done, see attached.\n\nOn Mon, 4 Mar 2024, Anna wrote:\nCould you send the log?",
        "Done, see attached.",
    ),
    "-----Original Message-----": (
        "See below.\n\n-----Original Message-----\nFrom: Anna\nSent: Monday\nOld text",
        "See below.",
    ),
    "Outlook From/Sent/To/Subject block": (
        "Approved.\n\n________________________________\nFrom: Acme Support <support@acme.example>\n"
        "Sent: Monday, March 4, 2024 10:02 AM\nTo: Zoë Müller\nSubject: Re: VAT\n\nOld text",
        "Approved.",
    ),
    "Sent from my iPhone": (
        "The app crashes on start.\n\nSent from my iPhone",
        "The app crashes on start.",
    ),
    "Get Outlook for iOS": ("Still broken.\n\nGet Outlook for iOS", "Still broken."),
    "-- signature separator": (
        "Please reset my 2FA.\n\n-- \nJosé Álvarez\nCTO, Example SL\n+34 600 000 000",
        "Please reset my 2FA.",
    ),
    "Best regards footer with name, title and phone": (
        "The export is empty again.\n\nBest regards,\nZoë Müller\nFinance\n+49 30 1234567",
        "The export is empty again.",
    ),
    "closing Thanks! alone": (
        "Where do I find my invoices?\n\nThanks!",
        "Where do I find my invoices?",
    ),
    "Zendesk reply marker": (
        "Thanks, that worked.\n\n##- Please type your reply above this line -##\n\nKenji Tanaka "
        "(Acme Support)\n\nPlease clear your cookies.",
        "Thanks, that worked.",
    ),
    "French reply header": (
        "Merci, ça marche.\n\nLe lun. 4 mars 2024 à 10:02, Anna <anna@acme.example> a écrit :\n"
        "> Essayez encore.",
        "Merci, ça marche.",
    ),
    "German reply header": (
        "Danke, erledigt.\n\nAm 04.03.2024 um 10:02 schrieb Anna <anna@acme.example>:\n"
        "> Bitte neu laden.",
        "Danke, erledigt.",
    ),
    "Chinese reply header": (
        "好的\uff0c已经解决了。\n\n在 2024年3月4日 10:02\uff0cAnna <anna@acme.example> 写道\uff1a\n"
        "> 请清除缓存。",
        "好的\uff0c已经解决了。",
    ),
}


@pytest.mark.parametrize(("raw", "expected"), REPLY_CASES.values(), ids=REPLY_CASES.keys())
def test_quoted_chains_signatures_and_sign_offs_are_stripped(raw: str, expected: str) -> None:
    assert strip_quotes_and_signature(raw) == expected


KEPT_CASES = {
    "a sentence starting with On": "On Monday the backup failed with error 42.\nIt wrote: nothing.",
    "Thanks! followed by the actual answer": (
        "Hi,\n\nThanks!\n\nPlease go to Settings > Billing and click Refund."
    ),
    "a dash list and a CLI flag": "Try:\n- restart\n- run `sync --force`",
    "Markdown heading and code fence": "### Steps\n\n```\n$ widgets --version\n2.3.1\n```",
}


@pytest.mark.parametrize("text", KEPT_CASES.values(), ids=KEPT_CASES.keys())
def test_text_without_quotes_or_signatures_is_left_as_it_is(text: str) -> None:
    assert strip_quotes_and_signature(text) == text


def test_html_blocks_lists_links_and_entities_become_text() -> None:
    html = (
        "<html><head><title>x</title><style>p{color:red}</style></head><body>"
        "<p>Hi&nbsp;Zoë,</p><p>Do this:<br>first &amp; foremost</p>"
        "<ol><li>Open <a href='https://app.acme.example/settings'>Settings</a></li>"
        "<li>Click <b>Save</b></li></ol><ul><li>done</li></ul>"
        "<script>alert(1)</script><pre>  indented\n    code</pre></body></html>"
    )

    assert html_to_text(html) == (
        "Hi Zoë,\n\nDo this:\nfirst & foremost\n\n"
        "1. Open Settings (https://app.acme.example/settings)\n2. Click Save\n\n- done\n\n"
        "  indented\n    code"
    )


def test_html_quotes_and_signatures_of_mail_clients_are_left_out() -> None:
    gmail = (
        '<div dir="ltr">Still failing.<div><br></div>'
        '<div class="gmail_signature"><div>José</div><div>CTO</div></div>'
        '<div class="gmail_quote"><div dir="ltr" class="gmail_attr">On Mon, Anna wrote:<br></div>'
        '<blockquote class="gmail_quote"><div>Please retry.</div></blockquote></div></div>'
    )
    apple = '<div>Yes.</div><blockquote type="cite"><div>Did it work?</div></blockquote><p>Bye</p>'
    outlook = (
        '<div>Approved.</div><div id="appendonsend"></div><hr><div id="divRplyFwdMsg"><b>From:</b>'
        " Anna</div><div>Old message that must not appear</div>"
    )

    assert html_to_text(gmail) == "Still failing."
    assert html_to_text(apple) == "Yes.\nBye"
    assert html_to_text(outlook) == "Approved."


def test_broken_html_still_gives_its_text() -> None:
    assert html_to_text("<p>one<p>two<div>three<br/>four") == "one\ntwo\nthree\nfour"
    assert html_to_text("a <b>bold</i> move &unknown; <") == "a bold move &unknown; <"


def test_looks_like_html_tells_markup_from_angle_brackets_in_text() -> None:
    assert looks_like_html("<p>Hello</p>")
    assert looks_like_html("line one<br>line two")
    assert not looks_like_html("if a < b and c > d")
    assert not looks_like_html("List<String> items = new ArrayList<>();")


def test_clean_text_removes_what_the_store_cannot_hold() -> None:
    assert clean_text("a\x00b\ufeffc\ud800d") == "abc?d"


def test_body_text_runs_html_conversion_then_stripping() -> None:
    html = "<p>It works now.</p><p>Kind regards,<br>Zoë Müller</p><p>Sent from my iPhone</p>"

    assert body_text(html, is_html=True) == "It works now."
    assert body_text("<p>kept as typed</p>", is_html=False) == "<p>kept as typed</p>"


def paragraph(*nodes: dict[str, object]) -> dict[str, object]:
    return {"type": "paragraph", "content": list(nodes)}


def text(value: str, **extra: object) -> dict[str, object]:
    return {"type": "text", "text": value, **extra}


def test_adf_document_becomes_text() -> None:
    link = {"type": "link", "attrs": {"href": "https://docs.acme.example"}}
    document = {
        "type": "doc",
        "version": 1,
        "content": [
            paragraph(
                text("Hi "),
                {"type": "mention", "attrs": {"id": "1", "text": "@Björn"}},
                text(", see "),
                text("the docs", marks=[link]),
                {"type": "hardBreak"},
                {"type": "emoji", "attrs": {"shortName": ":tada:", "text": "🎉"}},
            ),
            {"type": "heading", "attrs": {"level": 2}, "content": [text("Steps")]},
            {
                "type": "orderedList",
                "attrs": {"order": 3},
                "content": [
                    {"type": "listItem", "content": [paragraph(text("three"))]},
                    {"type": "listItem", "content": [paragraph(text("four"))]},
                ],
            },
            {"type": "blockquote", "content": [paragraph(text("quoted reply"))]},
            {"type": "codeBlock", "content": [text("x = 1\ny = 2")]},
            {
                "type": "table",
                "content": [
                    {
                        "type": "tableRow",
                        "content": [
                            {"type": "tableHeader", "content": [paragraph(text("plan"))]},
                            {"type": "tableHeader", "content": [paragraph(text("price"))]},
                        ],
                    }
                ],
            },
            {"type": "mediaSingle", "content": [{"type": "media", "attrs": {"id": "a"}}]},
            {"type": "someFutureNode", "content": [paragraph(text("still read"))]},
        ],
    }

    assert adf_to_text(document) == (
        "Hi @Björn, see the docs (https://docs.acme.example)\n🎉\n\nSteps\n\n3. three\n4. four\n\n"
        "x = 1\ny = 2\n\nplan | price\n\nstill read"
    )


def test_adf_nested_beyond_reason_is_cut_off_not_a_crash() -> None:
    node: dict[str, object] = text("deep")
    for _ in range(5000):
        node = {"type": "panel", "content": [node]}

    assert adf_to_text(node) == ""
    assert adf_to_text({"type": "doc", "content": "not a list"}) == ""
    assert adf_to_text(None) == ""


MARKUP = st.sampled_from(
    [
        *"<>!/[]-='\" abpq\n\r&;#?",
        *("<!--", "<![CDATA[", "<![if", "<?", "</", "<p>", "<pre>", "</pre>", "<blockquote>"),
        *("<div class='gmail_quote'>", "&#x110000;", "&#0;", "\x00", "\ud800", "</a>"),
        *("<a href='https://x'>", "<ol>", "<li>", "On x wrote:", "> ", "-- "),
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(MARKUP, max_size=40).map("".join))
def test_any_body_gives_storable_text_and_never_an_exception(raw: str) -> None:
    for is_html in (True, False):
        text = body_text(raw, is_html=is_html)
        assert "\x00" not in text
        assert text.encode("utf-8").decode("utf-8") == text  # no lone surrogates
        assert text == text.strip()


def test_a_marked_section_html_parser_rejects_is_read_as_text() -> None:
    assert html_to_text("<p>a</p><![ifa<b>c</b>") == "a\n\n<![ifac"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["type", "content", "text", "attrs", "marks"]), inner)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_any_json_as_adf_gives_text_and_never_an_exception(value: object) -> None:
    assert isinstance(adf_to_text(value), str)
