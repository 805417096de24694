"""The demo's support domain: a helpdesk's ticket export and feedback on an assistant.

The tickets are a CSV export whose columns are named after the fields `flywheel ingest
tickets --format csv` reads (so no `--mapping` is needed). They hold what real ones do: HTML
bodies, signatures, a reopened ticket solved differently the second time (a preference
pair), an escalation, satisfaction ratings good and bad, tickets still open (rejected as
unresolved), and personal data the redactor must catch before anything is stored: e-mail
addresses, phone numbers, a payment card (a Luhn-valid test number), an IBAN (the standard
example), an IP address, an AWS access key (AWS's documented example key) and the names of
requesters and agents. Each ticket has its helpdesk category (billing, account, technical).
Every person, company and number here is invented.

The feedback is what agents and customers said about an assistant's draft answers: thumbs and
stars from several raters on competing drafts of one question (pairs by score), corrections
(an SFT example and a pair each), side-by-side comparisons, a tie and outcomes.
"""

from __future__ import annotations

import csv
import io
from typing import Any

COLUMNS = (
    "id",
    "subject",
    "body",
    "first_resolution",
    "resolution",
    "status",
    "requester",
    "assignee",
    "satisfaction",
    "reopened",
    "escalated",
    "category",
)

CATEGORIES = {
    "billing": ("SUP-2001", "SUP-2002", "SUP-2004", "SUP-2008", "SUP-2010", "SUP-2014", "SUP-2019"),
    "account": ("SUP-2003", "SUP-2007", "SUP-2012", "SUP-2015", "SUP-2016"),
    "technical": ("SUP-2005", "SUP-2006", "SUP-2009", "SUP-2011", "SUP-2013", "SUP-2017",
                  "SUP-2018", "SUP-2020"),
}  # fmt: skip
"""The helpdesk's own ticket category, a column of the export: the support domain's natural
labels, which `flywheel ingest tickets` turns into `ticket.category:...` tags."""

TICKETS: tuple[dict[str, str], ...] = (
    {
        "id": "SUP-2001",
        "subject": "Invoice shows the wrong VAT rate",
        "body": "<p>Hello,</p><p>Our March invoice charges 19% VAT but we are a reverse-charge "
        "customer (VAT ID DE123456789).</p><p>Best regards,<br>Hannah Becker<br>Finance, "
        "Becker &amp; Partner GmbH</p>",
        "resolution": "Your account was missing the reverse-charge flag. We set it and issued "
        "a corrected invoice without VAT; the original is cancelled.",
        "status": "Solved",
        "requester": "Hannah Becker",
        "assignee": "Tomás Ortega",
        "satisfaction": "good",
    },
    {
        "id": "SUP-2002",
        "subject": "Charged twice this month",
        "body": "I see two charges of 49.00 on my card 4111 1111 1111 1111 for May. Please "
        "refund one. You can reach me at +1 (415) 555-0142.",
        "first_resolution": "Both charges are correct: one is for April.",
        "resolution": "The second charge came from a retried payment that should have been "
        "cancelled. We refunded it; it shows on your statement within 5 business days.",
        "status": "Closed",
        "requester": "Marcus Lee",
        "assignee": "Priya Natarajan",
        "satisfaction": "4",
        "reopened": "yes",
    },
    {
        "id": "SUP-2003",
        "subject": "Cannot log in after password reset",
        "body": "After resetting my password the login page says 'invalid token'. My e-mail "
        "is olivia.grant@example.com.",
        "resolution": "Hi Olivia, reset links expire after 30 minutes and only the newest one "
        "works. We sent a fresh link; open it in the same browser within 30 minutes.",
        "status": "Solved",
        "requester": "Olivia Grant",
        "assignee": "Tomás Ortega",
        "satisfaction": "5",
    },
    {
        "id": "SUP-2004",
        "subject": "Refund to a different bank account",
        "body": "Please send the refund for order 88231 to my new account IBAN "
        "DE89 3704 0044 0532 0130 00 instead of the card.",
        "resolution": "Refunds can only go back to the original payment method. We refunded "
        "order 88231 to your card ending 1111.",
        "status": "Solved",
        "requester": "Jonas Weber",
        "assignee": "Priya Natarajan",
        "satisfaction": "bad",
    },
    {
        "id": "SUP-2005",
        "subject": "API returns 401 from our server",
        "body": "Our integration on 203.0.113.57 gets 401 Unauthorized since this morning. "
        "We use the key AKIAIOSFODNN7EXAMPLE in the header.\n\nSent from my iPhone",
        "first_resolution": "Please clear your browser cache and try again.",
        "resolution": "That key was revoked by the automatic rotation on Monday. Create a new "
        "key under Settings > API keys and send it as a Bearer token; never post keys in a "
        "ticket.",
        "status": "Resolved",
        "requester": "Aisha Khan",
        "assignee": "Daniel Kim",
        "satisfaction": "good",
        "reopened": "1",
    },
    {
        "id": "SUP-2006",
        "subject": "Export to CSV is empty",
        "body": "The report export downloads an empty CSV file for last quarter.",
        "resolution": "Exports over 50 MB were cut off by a proxy timeout. We raised the limit; "
        "the quarterly export now downloads in full.",
        "status": "Closed",
        "requester": "Lucas Martin",
        "assignee": "Daniel Kim",
        "satisfaction": "",
    },
    {
        "id": "SUP-2007",
        "subject": "How do I add a second admin?",
        "body": "<div>When I invite a colleague as <b>admin</b> the button is greyed out.</div>",
        "resolution": "Your plan allows one admin. Upgrade to Team under Settings > Billing, or "
        "give your colleague the Manager role, which can do everything except billing.",
        "status": "Solved",
        "requester": "Sofia Rossi",
        "assignee": "Tomás Ortega",
        "satisfaction": "4",
    },
    {
        "id": "SUP-2008",
        "subject": "Charged after cancelling",
        "body": "I cancelled on June 3rd but was charged on July 1st. Call me at 020 7946 0958.",
        "first_resolution": "Charges cannot be reversed after 14 days.",
        "resolution": "Your cancellation did not go through because of a payment-provider "
        "outage. We refunded the July charge in full and confirmed the cancellation.",
        "status": "Resolved",
        "requester": "Emily Clarke",
        "assignee": "Priya Natarajan",
        "satisfaction": "bad",
        "escalated": "yes",
    },
    {
        "id": "SUP-2009",
        "subject": "Does the API support SAML SSO?",
        "body": "We want to use Okta for single sign-on. Is SAML supported?",
        "resolution": "",
        "status": "Open",
        "requester": "Wei Zhang",
        "assignee": "",
    },
    {
        "id": "SUP-2010",
        "subject": "Change the billing e-mail",
        "body": "Please send invoices to accounts@northwind.example instead of my personal "
        "address noah.fischer@example.org.",
        "resolution": "Done: invoices now go to the billing contact you set. You can change it "
        "yourself under Settings > Billing > Invoice recipient.",
        "status": "Solved",
        "requester": "Noah Fischer",
        "assignee": "Daniel Kim",
        "satisfaction": "5",
    },
    {
        "id": "SUP-2011",
        "subject": "Webhook deliveries failing",
        "body": "Our webhook endpoint shows no events since the 12th. Nothing changed on our side.",
        "first_resolution": "Webhooks are working normally on our side.",
        "resolution": "Your endpoint's TLS certificate expired on the 12th, so deliveries "
        "failed the handshake. Renew the certificate, then replay the failed events from the "
        "Webhooks page.",
        "status": "Solved",
        "requester": "Chloé Dubois",
        "assignee": "Daniel Kim",
        "satisfaction": "good",
        "reopened": "yes",
    },
    {
        "id": "SUP-2012",
        "subject": "Data retention question",
        "body": "How long do you keep deleted projects? Our auditor asks.",
        "resolution": "Deleted projects are recoverable for 30 days and purged from backups "
        "after 90 days. Our data processing agreement has the details.",
        "status": "Closed",
        "requester": "Fatima Al-Sayed",
        "assignee": "Tomás Ortega",
        "satisfaction": "",
    },
    {
        "id": "SUP-2013",
        "subject": "Mobile app crashes on start",
        "body": "The Android app closes right after the splash screen since the last update.",
        "resolution": "Version 4.2.0 crashed on Android 9 devices. Version 4.2.1, in the Play "
        "Store now, fixes it.",
        "status": "Solved",
        "requester": "Kenji Tanaka",
        "assignee": "Daniel Kim",
        "satisfaction": "3",
    },
    {
        "id": "SUP-2014",
        "subject": "Upgrade mid-cycle pricing",
        "body": "If we upgrade to Team in the middle of the month, what do we pay?",
        "resolution": "You pay the difference for the remaining days of the cycle now; the "
        "next invoice is the full Team price.",
        "status": "Solved",
        "requester": "Grace Okafor",
        "assignee": "Priya Natarajan",
        "satisfaction": "good",
    },
    {
        "id": "SUP-2015",
        "subject": "Two-factor codes not arriving",
        "body": "SMS codes do not arrive on my phone +44 7700 900123.",
        "first_resolution": "Please check that your phone has signal.",
        "resolution": "Our SMS provider blocks some UK numbers that were ported. Switch to an "
        "authenticator app under Security > Two-factor; we added backup codes to your account.",
        "status": "Resolved",
        "requester": "Oliver Smith",
        "assignee": "Tomás Ortega",
        "satisfaction": "2",
        "reopened": "yes",
    },
    {
        "id": "SUP-2016",
        "subject": "Delete my account",
        "body": "Please delete my account and all my data under GDPR.",
        "resolution": "We deleted your account and its data. Backups are purged within 90 days; "
        "we sent the confirmation to the address on file.",
        "status": "Solved",
        "requester": "Lena Novak",
        "assignee": "Priya Natarajan",
        "satisfaction": "good",
    },
    {
        "id": "SUP-2017",
        "subject": "Slow dashboard",
        "body": "The dashboard takes a minute to load for our workspace with 40 projects.",
        "resolution": "",
        "status": "Pending",
        "requester": "Mateo García",
        "assignee": "Daniel Kim",
    },
    {
        "id": "SUP-2018",
        "subject": "Wrong time zone in reports",
        "body": "Reports show UTC times but our workspace is set to Europe/Berlin.",
        "resolution": "Reports used the account's time zone, not the workspace's. Set it under "
        "Profile > Time zone; we also fixed the default for new reports.",
        "status": "Solved",
        "requester": "Hannah Becker",
        "assignee": "Tomás Ortega",
        "satisfaction": "4",
    },
    {
        "id": "SUP-2019",
        "subject": "Discount for nonprofits",
        "body": "We are a registered charity. Do you offer a discount?",
        "resolution": "Yes: registered nonprofits get 50% off Team. Reply with your "
        "registration number and we apply it from the next invoice.",
        "status": "Solved",
        "requester": "Samuel Osei",
        "assignee": "Priya Natarajan",
        "satisfaction": "5",
    },
    {
        "id": "SUP-2020",
        "subject": "Import from spreadsheet fails",
        "body": "Importing contacts.xlsx stops at row 1,204 with 'invalid date'.",
        "first_resolution": "Please save the file as CSV and import that instead.",
        "resolution": "Row 1,204 has a date written as 31/02/2024, which does not exist. Fix "
        "that cell and import again; the importer now names the bad cell.",
        "status": "Closed",
        "requester": "Isabella Rossi",
        "assignee": "Daniel Kim",
        "satisfaction": "good",
        "reopened": "yes",
    },
)


def tickets_csv() -> str:
    """The export as CSV text (RFC 4180: CRLF line ends, quotes where needed)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(COLUMNS)
    category = {ticket: name for name, tickets in CATEGORIES.items() for ticket in tickets}
    for ticket in TICKETS:
        row = ticket | {"category": category.get(ticket["id"], "")}
        writer.writerow([row.get(column, "") for column in COLUMNS])
    return buffer.getvalue()


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


REFUND = "How do I get a refund for an annual plan I bought last week?"
REFUND_GOOD = (
    "Annual plans are refundable in full within 14 days. Go to Settings > Billing > Cancel "
    "plan and choose 'Refund'; the money is back on your card within 5 business days."
)
REFUND_BAD = "Refunds are not possible."
REFUND_VAGUE = "Please contact our billing team."
EXPORT = "Can I export all my projects at once?"
EXPORT_GOOD = (
    "Yes: Settings > Data > Export workspace creates one ZIP of every project; we e-mail you "
    "a link when it is ready."
)
EXPORT_BAD = "You have to export each project separately."
SSO = "Do you support single sign-on with Okta?"
SSO_A = "Yes, SAML single sign-on with Okta, Azure AD and Google is included in Enterprise."
SSO_B = "Single sign-on is available. Contact sales."
INVOICE = "Where do I find old invoices?"
INVOICE_DRAFT = "Invoices are sent by e-mail."
INVOICE_FIXED = (
    "All invoices are under Settings > Billing > Invoices, where you can download each as a PDF."
)
LIMITS = "What is the API rate limit?"
LIMITS_DRAFT = "The API allows 100 requests per minute."
LIMITS_FIXED = "The API allows 600 requests per minute per key; bursts of up to 100 are fine."
PASSWORD = "I forgot my password and the reset mail never came. My address is ana@example.net"
PASSWORD_DRAFT = "Check your spam folder."
PASSWORD_FIXED = (
    "Check your spam folder first. If the mail is not there after 10 minutes, your company's "
    "mail filter may block us: ask IT to allow no-reply@acme-app.example, then request a new "
    "reset link."
)
SEATS = "How do I remove a user from my team?"
SEATS_A = "Settings > Team, open the user's menu and choose Remove; their seat frees at once."
SEATS_B = "Settings > Team > Remove."
TWO_FA = "Can I turn off two-factor authentication?"
TWO_FA_REPLY = (
    "Yes, under Security > Two-factor, unless your workspace admin requires it for everyone."
)


def feedback_events() -> list[dict[str, Any]]:
    """Feedback on the support assistant's drafts, `POST /v1/feedback` bodies that carry
    their own conversation (no `domain`: they go to the domain the file is ingested into)."""
    return [
        _rating(REFUND, REFUND_GOOD, {"thumbs": "up"}, "agent-7f3a", 1),
        _rating(REFUND, REFUND_GOOD, {"stars": 5}, "cust-19c2", 2),
        _rating(REFUND, REFUND_BAD, {"thumbs": "down"}, "agent-7f3a", 3),
        _rating(REFUND, REFUND_BAD, {"stars": 1}, "cust-52d0", 4),
        _rating(REFUND, REFUND_VAGUE, {"stars": 2}, "cust-19c2", 5),
        _rating(EXPORT, EXPORT_GOOD, {"stars": 4}, "cust-88e1", 6),
        _rating(EXPORT, EXPORT_BAD, {"stars": 2}, "cust-88e1", 7),
        _rating(TWO_FA, TWO_FA_REPLY, {"thumbs": "up"}, "agent-2b6e", 8),
        _correction(INVOICE, INVOICE_DRAFT, INVOICE_FIXED, "agent-2b6e", 9),
        _correction(LIMITS, LIMITS_DRAFT, LIMITS_FIXED, "agent-7f3a", 10),
        _correction(PASSWORD, PASSWORD_DRAFT, PASSWORD_FIXED, "agent-c41d", 11),
        _comparison(SSO, [SSO_A, SSO_B], 0, "agent-c41d", 12),
        _comparison(SSO, [SSO_B, SSO_A], 1, "cust-52d0", 13),
        _comparison(SEATS, [SEATS_A, SEATS_B], None, "agent-2b6e", 14),
        {
            "kind": "outcome",
            "prompt": EXPORT,
            "response": EXPORT_BAD,
            "value": {"success": False, "reason": "customer opened a ticket"},
            "event_id": "demo-support-15",
        },
    ]


def _rating(
    prompt: str, response: str, value: dict[str, Any], rater: str, number: int
) -> dict[str, Any]:
    return {
        "kind": "rating",
        "prompt": prompt,
        "response": response,
        "value": value,
        "rater": rater,
        "event_id": f"demo-support-{number}",
    }


def _correction(prompt: str, draft: str, fixed: str, rater: str, number: int) -> dict[str, Any]:
    return {
        "kind": "correction",
        "prompt": prompt,
        "response": draft,
        "value": {"text": fixed},
        "rater": rater,
        "event_id": f"demo-support-{number}",
    }


def _comparison(
    prompt: str, responses: list[str], preferred: int | None, rater: str, number: int
) -> dict[str, Any]:
    value: dict[str, Any] = {"messages": _user(prompt), "responses": responses}
    if preferred is None:
        value["tie"] = True
    else:
        value["preferred"] = preferred
    return {
        "kind": "comparison",
        "value": value,
        "rater": rater,
        "event_id": f"demo-support-{number}",
    }
