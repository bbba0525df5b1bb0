"""``StartupError``: a file the gateway needs cannot be used as it is.

Rules
-----
* Every error that names a file the gateway reads at start (its databases, the TLS files, the password
  file, the ACL file) is a ``StartupError``: ``path`` is the file (or the setting that stands for one),
  ``line`` the 1-based line where the file has lines, ``why`` what is wrong and, where there is one, what
  to do. The text is always ``<path>[:<line>]: <why>``, so an operator reads the file name first.
* ``appliance run`` catches the base class once (``gateway.run_gateway``): it logs ``cannot start: ...``
  and exits with status 1. A new kind of file error subclasses ``StartupError`` and needs no new ``except``.
* Raised later (a SIGHUP reload, a commit that fails while serving), the same error names the same file;
  the caller decides whether it is fatal there.
"""

from __future__ import annotations

import os


class StartupError(Exception):
    """A file that cannot be used: ``str()`` is ``<path>[:<line>]: <why>``."""

    def __init__(self, path: str | os.PathLike[str], why: str, *, line: int | None = None) -> None:
        self.path = os.fspath(path)
        self.why = why
        self.line = line
        super().__init__(f"{self.location}: {why}")

    @property
    def location(self) -> str:
        """Where the problem is, as the message starts with it."""
        return self.path if self.line is None else f"{self.path}:{self.line}"
