"""Source readers (tickets, repositories, feedback and task files), redaction, dedup.

Turns records into SFT examples, preference pairs and verifiable tasks; imports `flywheel` only.
"""
