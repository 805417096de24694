"""One settings object for the whole platform, read from `FLYWHEEL_*` variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KIB = 1024
MIB = 1024 * KIB


class Settings(BaseSettings):
    """Platform settings. Every field can be set as `FLYWHEEL_<NAME>`."""

    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_", extra="ignore")

    home: Path = Field(
        default=Path(".flywheel"),
        description="Workspace directory: the embedded SQLite database, MLflow store, reports.",
    )
    database_url: SecretStr | None = Field(
        default=None,
        description="SQLAlchemy URL, e.g. postgresql+psycopg://user@host/db. "
        "Unset: a SQLite file in the workspace (quickstart only).",
    )
    redaction_key: SecretStr | None = Field(
        default=None,
        description="Secret that keys the surrogates redaction writes in place of personal "
        "data (the same person is the same surrogate within a record, unlinkable across "
        "records). Set the same value on every host. Unset: a random key kept in the "
        "workspace (redaction.key), made on first use.",
    )
    db_pool_size: int = Field(
        default=20,
        ge=1,
        description="Connections per process. No overflow: connections are reused, never churned.",
    )
    db_pool_pre_ping: bool = Field(
        default=False,
        description="Test each connection on checkout (one more round trip per request). "
        "Off: a dropped connection fails one request and the pool is refreshed.",
    )

    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="MLflow tracking server (http://mlflow.internal:5000) or store URI. "
        "Unset: a SQLite-backed store in the workspace, artifacts beside it.",
    )

    base_model: Path | None = Field(
        default=None,
        description="The base model directory `flywheel train` adapts (a domain's own "
        "`base_model` config comes first).",
    )

    cycle_heartbeat_s: float = Field(
        default=10.0, gt=0, description="How often a running cycle marks itself alive."
    )
    cycle_stale_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A running cycle silent this long is presumed dead: another may resume it. "
        "A dead worker's retried job waits until its run has been silent this long (the run's "
        "last beat can be newer than its worker's): keep it <= FLYWHEEL_STALLED_AFTER_S.",
    )

    scheduler_tick_cron: str = Field(
        default="* * * * *",
        validate_default=False,  # valid; checking it would load croniter in every command
        description="When workers tick the schedule (UTC cron; a 6th field is seconds).",
    )
    stalled_retry_cron: str = Field(
        default="* * * * *",
        validate_default=False,  # valid; checking it would load croniter in every command
        description="When workers look for jobs of dead workers (UTC cron; 6th field: seconds).",
    )
    worker_heartbeat_s: float = Field(
        default=10.0, gt=0, description="How often a worker tells the database it is alive."
    )
    stalled_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A worker silent this long is presumed dead and its jobs are retried "
        "(keep it several heartbeats long).",
    )
    stalled_max_retries: int = Field(
        default=3,
        ge=0,
        description="How many times a cycle whose worker died is retried before it fails.",
    )
    retention_raw_event_weeks: int | None = Field(
        default=None,
        ge=1,
        description="Delete raw feedback events and interactions older than this many weeks "
        "once compiled (daily, on workers); compiled signal and its provenance stay, and "
        "forget still reaches it. A domain's `retention.raw_event_weeks` comes first. "
        "Unset: keep everything.",
    )

    max_body_bytes: int = Field(default=1 * MIB, ge=1024, description="Request body cap.")

    # What `flywheel serve` bounds per connection, before the app sees a request (per process).
    max_head_bytes: int = Field(
        default=32 * KIB,
        ge=1024,
        description="Request line and headers together: past it, 431 and the connection closed.",
    )
    max_header_bytes: int = Field(
        default=8 * KIB, ge=256, description="One header, name and value together (431 past it)."
    )
    max_headers: int = Field(default=100, ge=1, description="Headers per request (431 past it).")
    header_read_timeout_s: float = Field(
        default=10.0, gt=0, description="A request head begun must be complete within this."
    )
    body_read_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A request body must arrive in full within this of its head (408 or cut).",
    )
    idle_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="A connection that starts no request this long (after connecting or a "
        "response) is closed.",
    )
    max_connections: int = Field(
        default=1000, ge=1, description="Open connections per server process (503 past it)."
    )
    rate_limit_per_s: float = Field(
        default=50.0,
        gt=0,
        description="Sustained requests per second per API key: a key may make "
        "FLYWHEEL_RATE_LIMIT_BURST requests in any burst/rate seconds (rounded up to whole "
        "seconds). Per process, or shared by every worker and host with FLYWHEEL_REDIS_URL.",
    )
    rate_limit_burst: int = Field(default=200, ge=1, description="Requests a key may burst.")
    auth_cache_ttl_s: float = Field(
        default=2.0,
        ge=0,
        description="How long a process trusts a looked-up API key; bounds how long a revoked "
        "key keeps working. 0 looks the key up on every request.",
    )

    # Webhooks to serving stacks on every promotion and rollback (flywheel.registry.webhooks).
    webhook_urls: str = Field(
        default="",
        description="Comma-separated URLs told of every champion move (a domain's config may "
        "add its own `webhooks: [url, ...]`). Empty: none.",
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="Key of the HMAC-SHA256 signature each webhook carries "
        "(X-Flywheel-Signature). Required to send any.",
    )
    webhook_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="One webhook request's timeout."
    )
    webhook_max_attempts: int = Field(
        default=5, ge=1, le=50, description="Attempts before a delivery is recorded failed."
    )
    webhook_backoff_s: float = Field(
        default=1.0,
        ge=0,
        description="Wait after a delivery's first failed attempt; doubled after each next one "
        "(with up to 50% random jitter), capped at FLYWHEEL_WEBHOOK_BACKOFF_MAX_S.",
    )
    webhook_backoff_max_s: float = Field(
        default=300.0, ge=0, description="The longest wait between two attempts."
    )
    webhook_send_budget_s: float = Field(
        default=10.0,
        ge=0,
        description="How long a promotion's command or request spends delivering its webhooks "
        "after it commits; what is not delivered by then waits for `flywheel models webhooks "
        "deliver` or the worker.",
    )

    # The gateway's recording of served calls (flywheel.inference.recording).
    gateway_spool_path: Path | None = Field(
        default=None,
        description="Append-only JSONL file where the gateway keeps the calls it could not "
        "write while the database was down, replayed once it is back. "
        "Unset: <FLYWHEEL_HOME>/gateway-spool.jsonl.",
    )
    gateway_spool_max_mb: float = Field(
        default=256.0,
        gt=0,
        description="The spool's size cap; past it, calls are dropped (and counted in "
        "flywheel_gateway_records_dropped) until a replay empties it.",
    )

    @property
    def resolved_gateway_spool_path(self) -> Path:
        return self.gateway_spool_path or self.home / "gateway-spool.jsonl"

    @property
    def webhook_url_list(self) -> list[str]:
        return [url.strip() for url in self.webhook_urls.split(",") if url.strip()]

    @field_validator("webhook_urls")
    @classmethod
    def _are_urls(cls, value: str) -> str:
        for url in (part.strip() for part in value.split(",")):
            if url and not _is_http_url(url):
                raise ValueError(f"not an http(s) URL: {url!r}")
        return value

    @field_validator("scheduler_tick_cron", "stalled_retry_cron")
    @classmethod
    def _is_cron(cls, value: str) -> str:
        from croniter import croniter  # here: every command reads the settings at start-up

        if not croniter.is_valid(value):
            raise ValueError(f"not a cron expression: {value!r}")
        return value

    @property
    def resolved_database_url(self) -> str:
        """The URL to connect to: the configured one, or the workspace's SQLite file."""
        if self.database_url is not None:
            return self.database_url.get_secret_value()
        return f"sqlite:///{(self.home / 'flywheel.db').resolve()}"

    @property
    def resolved_mlflow_tracking_uri(self) -> str:
        if self.mlflow_tracking_uri:
            return self.mlflow_tracking_uri
        return f"sqlite:///{(self.home / 'mlflow.db').resolve()}"

    @property
    def mlflow_artifact_root(self) -> Path:
        """Where the embedded store keeps artifacts (a server keeps its own)."""
        return (self.home / "mlartifacts").resolve()

    @property
    def is_embedded(self) -> bool:
        return self.database_url is None

    # Floods and shared limits: what auth remembers (known keys, unknown key prefixes, the
    # rate-limit windows of keys and client addresses), in each process or in Redis.
    redis_url: SecretStr | None = Field(
        default=None,
        description="Redis (redis://host:6379/0) for the rate limits, the caches of known and "
        "unknown keys and key revocation, shared by every worker and host. Unset: each process "
        "keeps its own (the embedded setup; limits then multiply with workers and hosts).",
    )
    redis_key_prefix: str = Field(
        default="flywheel",
        min_length=1,
        description="Prefix of every Redis key Flywheel writes: one per deployment sharing a "
        "Redis database.",
    )
    unknown_key_cache_ttl_s: float = Field(
        default=30.0,
        ge=0,
        description="How long a key prefix with no live key behind it is refused without a "
        "database lookup. 0 looks every key up.",
    )
    unknown_key_cache_size: int = Field(
        default=100_000,
        ge=1,
        description="Unknown key prefixes each process remembers (without Redis); the oldest "
        "go first.",
    )
    address_failure_limit: int = Field(
        default=60,
        ge=1,
        description="Failed requests (401, 403, 429) a client address may make in a window of "
        "FLYWHEEL_ADDRESS_FAILURE_WINDOW_S from its first; past it, the address's requests that "
        "need a key lookup are refused with 429 before any database work.",
    )
    address_failure_window_s: int = Field(
        default=60, ge=1, description="The window of FLYWHEEL_ADDRESS_FAILURE_LIMIT, seconds."
    )
    address_refusal_delay_s: float = Field(
        default=1.0,
        ge=0,
        le=10,
        description="How long a refused address's 429 is held back (0.5-1.5 times this, at "
        "random): a client that retries in a loop then sends one request per connection per "
        "delay, not thousands per second.",
    )

    # The OpenAI-compatible gateway (`flywheel gateway`): where calls go and how models route.
    gateway_upstream_url: str | None = Field(
        default=None,
        description="The upstream's base URL, e.g. http://vllm.internal:8000/v1.",
    )
    gateway_upstream_key: SecretStr | None = Field(
        default=None, description="Bearer key the upstream wants, if any."
    )
    gateway_base_model: str | None = Field(
        default=None,
        description="The upstream's name for the base model (a base call's `model`). Unset: "
        "the first model the upstream lists.",
    )
    gateway_dynamic_lora: bool = Field(
        default=True,
        description="Download an adapter from the registry and load it into the upstream on "
        "first use. Off: the upstream serves every adapter already, by its name "
        "(<registered model>-v<version>).",
    )
    gateway_upstream_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="How long the upstream may stay silent (before its answer, or between two "
        "stream chunks) before the call fails with 504.",
    )
    gateway_route_cache_ttl_s: float = Field(
        default=2.0,
        ge=0,
        description="How long a process reuses a domain's champion, challenger and release "
        "config without asking the database: a promotion is served within this.",
    )


def _is_http_url(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)
