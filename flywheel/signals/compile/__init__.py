"""The feedback compiler: raw feedback events in, weighted training signal out.

    compile_feedback(sessions, tenant_id=..., domain_id=None, progress=None, link=False)
        -> CompileReport  (link: then the near-duplicate pass, as `flywheel compile` and cycles)

Groups. All feedback about one prompt (the conversation before the response) is judged
together, and every item it yields carries `group_key` = content hash of the normalised
conversation, so a prompt never straddles train and eval later.

Scores. Ratings and outcomes score a (prompt, response): thumbs up 1, down 0; stars s give
(s - 1)/4; outcome success 1, failure 0. Each rater's latest judgement counts once; events
without a rater count on their own, except outcomes, where the latest one stands.

Rules (`rules.py`), per prompt (responses told apart by their normalised text):
- two responses whose mean scores differ -> pair, higher over lower ("rating", "outcome",
  or "outcome+rating"; a prompt with more than 32 scored responses pairs its 32 most rated);
- a correction -> pair (corrected over original, "correction") and an SFT example of the
  corrected text, for as long as that pair stands;
- a comparison -> the preferred response over each other one ("comparison"); ties yield
  nothing and are counted (`ties_dropped`);
- a scored response that no standing pair covers -> a KTO-style label: desirable when its
  mean is above 1/2 (a lone thumbs-up, a success), undesirable below (a lone thumbs-down,
  a failure), nothing at exactly 1/2.

Weights (1.0 = one fresh, clear judgement by one rater):
- agreement: 2n/(n+1) for n raters (1, 1.33, 1.5, ... -> 2), n being the smaller side's
  raters for a score pair; scores also scale by their margin (|mean difference| for pairs,
  |2 mean - 1| for labels), so split opinions weigh less than unanimous ones;
- edit size: a correction weighs 1 - changed/2, `changed` being the share of the longer text
  between the common prefix and suffix (a small edit pinpoints the flaw; a rewrite, 0.5);
- recency: halves every 90 days of age, age counted from the prompt's newest event to the
  item's newest supporting event (not from the wall clock: recompiling is deterministic).

Conflicts. When two responses are judged both ways (by any mix of kinds), each direction's
evidence weights are summed; the heavier side wins with the difference as its weight and a
`why` of "<winning kinds>; outweighed <losing kinds>"; equal sides drop the pair. Both are
counted (`conflicts`, `conflicts_dropped`).

Incremental. Each compile records an ingest run (source_format "compile") whose checkpoint
holds a watermark: the newest event's `created_at`. The next compile recompiles only the
prompts with events newer than the watermark (less a 10-minute revisit window, for events
whose transactions committed late), from all of their events, and upserts: new items are
inserted; items it already holds (same content hash) get the new weight, `why` and
provenance; its items of those prompts that the evidence no longer supports are retracted
(weight 0, `why` prefixed "retracted: "), never deleted. Compiling twice adds and changes
nothing; a late event changes exactly the items of its prompt.

Provenance: `source_kind` "feedback", `source_ref` "feedback:" + the interactions and events
the item came from, `ingestor_version` COMPILER_VERSION. Every text is redacted (each distinct
text once per run and prompt: the prompt's group key scopes its surrogates) before it is
hashed and stored, the counts going to `redaction_report`; two responses that differ only in
what redaction replaced make no pair. Content hashes are
`content_sha256` of the stored (redacted) texts, so an item equal to one another source
stored is left as that source wrote it. `minhash` and `duplicate_of_id` are left to the
near-duplicate pass.

Tool calling (`turns.py`). A response that called tools (`interactions.response_tool_calls`)
or was given tools (`tools`) is told apart by its text, its calls (names and parsed arguments,
call ids aside) and its tools; a correction `{"tool_calls": [...]}` (or text) of it gets the
tools of what it corrects. Its items keep the calls (`completion_tool_calls`,
`chosen_tool_calls`, `rejected_tool_calls`; the text column holds its text, "" when it only
called tools) and the tools (`tools`), and their content hashes add both to a text item's
parts (`content_sha256(kind, messages, text, {"tool_calls", "tools"})`), so two items that
differ only in a call's arguments or in the tools are two items; an item with neither keeps
the hash it always had. Redaction reaches every string inside the calls' arguments; an
edit's precision is measured on the text and calls, not the tools. Comparisons stay text.

Transactions: one per domain, holding an advisory lock so that compiles of a domain take
turns; a failed compile writes nothing and is recorded as a failed ingest run.

Work split: on PostgreSQL one set-based query aggregates the events per (prompt, response)
and streams the result through a server-side cursor; Python judges, redacts and hashes; items
are written in chunks, each COPYed into a staging table and upserted by a background thread
while Python judges the next (`writer.py`). In a full compile of a large domain, a child
process finds the PII spans of the domain's texts on a connection of its own, from the start
of the query on, and the compiler takes them by the text's digest (`prefetch.py`): finds are a
pure function of the text, so this changes no stored item, only where the work is done. SQLite
aggregates the same way in Python (`evidence.py`) and upserts once at the end.

Known limits: evidence is grouped by the exact stored conversation; two conversations that
differ only in whitespace or Unicode form share a `group_key` but are judged apart, and an
item both support belongs to whichever was compiled first. Recompiling a few prompts finds
their events through the interaction index, but still hashes every interaction's conversation
and scans the events that carry their own (there is no stored prompt key to index).
"""

from __future__ import annotations

from flywheel.signals.compile.compiler import (
    CompileCounts,
    CompileReport,
    DomainCompile,
    Progress,
    compile_feedback,
    recompile_prompts,
)
from flywheel.signals.compile.evidence import event_prompts
from flywheel.signals.compile.items import group_key_of
from flywheel.signals.compile.writer import COMPILER_VERSION

__all__ = [
    "COMPILER_VERSION",
    "CompileCounts",
    "CompileReport",
    "DomainCompile",
    "Progress",
    "compile_feedback",
    "event_prompts",
    "group_key_of",
    "recompile_prompts",
]
