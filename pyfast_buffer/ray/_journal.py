"""The index actor's durable state: a snapshot written after every change and before the change is answered.

What only the index knows (in-flight prompts and their leases, the ledger, the entries without payloads,
the request ids it applied, which owner holds which id) is written as one checkpoint file
(``checkpoint.save_state``: atomic and checksummed; not fsynced, since it has to survive the death of
this process, not of the machine, whose loss takes the file too) before the call that changed it returns. Calls
that arrive while a snapshot is being written share the next one (group commit), so the cost per call falls
as the call rate rises. A restarted index loads the file and so continues with every answered call applied.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, Optional

from ..checkpoint import load_state, save_state


class Journal:
    """Writes ``capture()`` to ``path`` in a thread of its own; ``commit()`` returns once a snapshot has the change."""

    def __init__(self, path: str, capture: Callable[[], Dict[str, Any]]) -> None:
        self.path = path
        self._capture = capture
        self._cv = threading.Condition()
        self._wanted = 0
        self._written = 0
        self._failure: Optional[BaseException] = None
        self.writes = 0
        self.write_s = 0.0
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        threading.Thread(target=self._run, name="pyfast_buffer-journal", daemon=True).start()

    def mark(self) -> int:
        """Notes a change (call it while the change is visible to ``capture``); returns its version."""
        with self._cv:
            self._wanted += 1
            self._cv.notify_all()
            return self._wanted

    def wait(self, version: int) -> None:
        """Returns once a snapshot including ``version`` is on disk; raises OSError if writing failed."""
        with self._cv:
            while self._written < version and self._failure is None:
                self._cv.wait()
            if self._failure is not None:
                raise OSError(f"the buffer's journal {self.path!r} could not be written: {self._failure}")

    def commit(self) -> None:
        self.wait(self.mark())

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._wanted == self._written:
                    self._cv.wait()
                target = self._wanted
            try:
                start = time.perf_counter()
                save_state(self._capture(), self.path, fsync=False)
                self.write_s += time.perf_counter() - start
                self.writes += 1
            except BaseException as exc:  # reported to every waiting call
                with self._cv:
                    self._failure = exc
                    self._cv.notify_all()
                return
            with self._cv:
                self._written = target
                self._cv.notify_all()


class NoJournal:
    """``journal=False``: nothing is written, and the index is created without restarts (it never comes back empty)."""

    path = ""
    writes = 0
    write_s = 0.0

    def mark(self) -> int:
        return 0

    def wait(self, version: int) -> None:
        return None

    def commit(self) -> None:
        return None


def read(path: str) -> Optional[Dict[str, Any]]:
    """The last snapshot at ``path``, or None if there is none (a first start)."""
    if not os.path.exists(path):
        return None
    return load_state(path)
