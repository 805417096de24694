"""Source readers (tickets, repositories, feedback and task files), redaction, dedup.

Turns records into SFT examples, preference pairs and verifiable tasks. Built in the
ingestors issue; imports `flywheel` only.
"""
