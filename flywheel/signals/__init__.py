"""Training signal and its one writer: candidates from ingest redacted, hashed and stored
(`store`, `content`), the feedback compiler (`compile`), near-duplicate links (`dedup`),
ingest runs (`ingest_runs`), verifier QA of tasks (`verification`) and reads (`service`)."""
