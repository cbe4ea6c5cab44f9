"""Loading a model or tokenizer by a Hugging Face hub id when the hub may be out of reach.

``from_pretrained`` on a hub id asks the hub first, even for a cached model, and on a machine
without network huggingface_hub retries each request for about 45 s before it gives up.
:func:`hub_path` tries the hub's address once (3 s at most) before that: when it does not
answer, a cached model loads from its cached folder (no request at all), and one that is not
cached fails at once with the reason the hub cannot be reached (DNS, refused, timeout)."""

from __future__ import annotations

import functools
from pathlib import Path

from searchr1.sdk import ConfigValueError

#: how long the hub's address may take to answer the one probe
PROBE_TIMEOUT_S = 3.0


def hub_path(path: str, field: str, what: str, hint: str = "") -> str:
    """What ``from_pretrained`` should open for ``path`` (``field``'s value, a folder or a hub
    id): ``path`` itself, or, when the hub cannot be reached, the cached snapshot's folder; a
    hub id not in the cache then raises a ConfigValueError saying ``cannot load {what}``,
    why, and ``hint``. A folder on this machine and ``HF_HUB_OFFLINE=1`` need no probe."""
    from huggingface_hub import constants, snapshot_download

    if constants.HF_HUB_OFFLINE or Path(path).expanduser().exists():
        return path
    why = _unreachable(constants.ENDPOINT)
    if not why:
        return path
    try:
        return str(snapshot_download(path, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError), or not a hub id at all
        raise ConfigValueError(
            f"{field} = {path!r}: cannot load {what}: no folder of that name is here, it is not "
            f"in this machine's Hugging Face cache, and {why}; download it where there is "
            f"network (`hf download {path}`, into the same HF_HOME), give the path of a local "
            f"copy instead, or set HF_ENDPOINT to a mirror this machine reaches"
            + (f"; {hint}" if hint else "")
        ) from None


@functools.cache  # once per command: its tokenizer and its model ask the same hub
def _unreachable(endpoint: str) -> str:
    from searchr1.kit.http import probe, proxy_for, safe_url
    from searchr1.sdk import RemoteServerError, get_logger

    failure = probe(endpoint, PROBE_TIMEOUT_S)
    if failure is RemoteServerError:  # it answered
        return ""
    # safe_url: a mirror's address may carry credentials (user:token@host)
    why = f"the Hugging Face hub ({safe_url(endpoint)}) cannot be reached: {failure.summary}"
    if via := proxy_for(endpoint):
        why += f", through the proxy {via[1]} ({via[0]})"
    get_logger().warning("hub_unreachable", why=why, using="this machine's cache alone")
    return why
