"""``remote_checkpoint.json``: where a remote provider's checkpoint lives on the service.

A remote ``save_state`` keeps weights and optimizer state on the service; what the run folder
gets is this small record with the service's checkpoint URI, written by
:func:`write_record` and read back by :func:`read_checkpoint` when ``--resume`` calls
``load_state``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from searchr1.sdk import UserError, redact_text, write_text_atomic

CHECKPOINT_FILE = "remote_checkpoint.json"


def checkpoint_name(folder_name: str) -> str:
    """A service-side checkpoint name: the folder's name, made safe, plus a unique suffix (a
    rerun after --resume saves the same step again and must not collide)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", folder_name).strip("-._") or "state"
    return f"{stem[:80]}-{uuid.uuid4().hex[:8]}"


def write_record(folder: Path, **fields: Any) -> None:
    """Write the record atomically (a crash leaves the previous one or none, never half)."""
    record = {
        "format": 1,
        **fields,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if "api_base" in record:  # a key may sit in its query string
        record["api_base"] = redact_text(str(record["api_base"]))
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / CHECKPOINT_FILE, json.dumps(record, indent=2) + "\n")


def read_checkpoint(folder: Path) -> dict[str, Any]:
    """The record :func:`write_record` wrote in ``folder``."""
    file = folder / CHECKPOINT_FILE
    if not file.is_file():
        raise UserError(
            f"{folder}: no {CHECKPOINT_FILE}; this checkpoint was not written by a remote model "
            f"provider (resume it with the provider that saved it)"
        )
    record = json.loads(file.read_text("utf-8"))
    if not isinstance(record, dict) or not record.get("checkpoint_uri"):
        raise UserError(f"{file}: no checkpoint_uri in the record")
    return record
