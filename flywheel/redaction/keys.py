"""The secret that keys surrogates: `FLYWHEEL_REDACTION_KEY`, or a random one kept in the
workspace (`<home>/redaction.key`, mode 0600), made once and read back ever after.

Surrogates, and so the content hashes of redacted texts, depend on it: every host that writes
signal for the same database must use the same key, or the same text gets different
surrogates (and is not recognised as a duplicate) on different hosts.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from functools import lru_cache
from pathlib import Path

from flywheel.settings import Settings

KEY_FILE = "redaction.key"


def redaction_key() -> bytes:
    """The key for this process's settings (cached per configured key and workspace)."""
    return _key(os.environ.get("FLYWHEEL_REDACTION_KEY"), os.environ.get("FLYWHEEL_HOME"))


@lru_cache(maxsize=8)
def _key(configured: str | None, home: str | None) -> bytes:
    del configured, home  # cache keys only: Settings reads the same variables
    settings = Settings()
    if settings.redaction_key is not None and settings.redaction_key.get_secret_value():
        return hashlib.sha256(settings.redaction_key.get_secret_value().encode()).digest()
    return workspace_key(settings.home / KEY_FILE)


def workspace_key(path: Path) -> bytes:
    """The key kept at `path`, made there first if it does not exist. Two processes making it
    at once agree: the file is linked into place only if absent, and both read what won."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32) + "\n")
        try:
            os.link(staged, path)
        except FileExistsError:
            pass
        finally:
            staged.unlink()
    return bytes.fromhex(path.read_text().strip())
