"""One object's step of a sweep, run so that whatever goes wrong stays with that object.

Both sweeps use it: the Proxies' (``reconcile``, ``live``, ``deletion``) and the pools'
(``pools``). An object deleted meanwhile (``Gone``) is let go; a write that kept conflicting or
a source that refused (``StoreError``) fails that object for this sweep; any other exception is
a bug of ours, logged with its traceback once (then in one line while it repeats) and recorded on
the object, and the sweep goes on with the others.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from egress_proxies.sources.store import Gone, StoreError

log = logging.getLogger(__name__)


class Containment:
    """``run`` one step of one object. ``kind`` names what a step is for in the log ("Proxy",
    "pool"). Remembers each object's last crash (by uid) across sweeps, to log a traceback once."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._crashes: dict[str, str] = {}

    def run(self, label: str, uid: str, action: Callable[[], object], *, failed: Callable[[str], None],
            record_crash: Callable[[str], None], gone: Callable[[], None] | None = None) -> None:
        """Run ``action`` for the object ``label`` (its key, as logs name it). ``failed(why)``: the
        object failed this sweep; ``record_crash(signature)``: write the internal error onto it
        (its own failure is only logged); ``gone()``: it was deleted meanwhile."""
        try:
            action()
        except Gone:
            if gone is not None:
                gone()
        except StoreError as error:
            log.warning("%s: %s", label, error)
            failed(str(error))
        except Exception as error:  # noqa: BLE001 - containment is the point: logged with its traceback
            signature = f"{type(error).__name__}: {error}"
            if self._crashes.get(uid) != signature:
                self._crashes[uid] = signature
                log.error("%s: unexpected error (contained to this %s):\n%s", label, self.kind, traceback.format_exc())
            else:
                log.error("%s: unexpected error again (contained to this %s): %s", label, self.kind, signature)
            failed(signature)
            try:
                record_crash(signature)
            except Exception:  # the write itself may be what fails; the log has it
                log.debug("%s: could not record the internal error", label, exc_info=True)
