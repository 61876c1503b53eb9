"""Prefect events that the pipeline's data emits, for the served deployment's triggers.

Optional and side-effect-free without a server: an event is sent only when ``$PREFECT_API_URL``
names a running Prefect server (``make serve`` prints it); otherwise nothing is imported, no
ephemeral server starts and nothing is written. A failure to send is logged, never raised.

``lopd.bank.grew`` (resource ``lopd.bank.<absolute bank dir>``) is emitted by
:func:`lopd.memory.bank.append_round` when a new round file adds entries; deployment ``lopd/full``
(``flows/serve.py``) has a trigger on it for its own ``data/bank``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BANK_GREW = "lopd.bank.grew"


def bank_resource_id(bank_dir: str | Path) -> str:
    """The Prefect resource id of a bank directory: ``lopd.bank.<absolute path>``."""
    return f"lopd.bank.{Path(bank_dir).resolve()}"


def enabled() -> bool:
    return bool(os.environ.get("PREFECT_API_URL"))


def emit(event: str, resource_id: str, payload: dict[str, Any]) -> bool:
    """Send ``event`` about ``resource_id`` to the configured Prefect server; True if queued."""
    if not enabled():
        return False
    try:
        from prefect.events import emit_event

        return emit_event(event=event, resource={"prefect.resource.id": resource_id}, payload=payload) is not None
    except Exception as e:  # an event is a notification: never fail the data write that caused it
        log.warning("could not emit Prefect event %s for %s: %s: %s", event, resource_id, type(e).__name__, e)
        return False


def bank_grew(bank_dir: str | Path, round_: int, added: int, size: int) -> bool:
    return emit(BANK_GREW, bank_resource_id(bank_dir),
                {"bank_dir": str(Path(bank_dir).resolve()), "round": round_, "added": added, "size": size})
