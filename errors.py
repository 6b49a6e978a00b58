"""The errors a user can fix from the command line or the config.

``main.py`` turns every ``PaperlabError`` into one ``error:`` line and a non-zero exit, never a traceback
(``PAPERLAB_TRACEBACK=1`` shows it). A new kind of user error subclasses ``PaperlabError`` (or
``ConfigError``) where it is raised; ``main.py`` needs no edit. Anything else that escapes is a bug and
keeps its traceback.
"""

from __future__ import annotations


class PaperlabError(Exception):
    """A user error: the message says what is wrong and how to fix it."""

    #: the process exit code ``main.py`` returns for this error
    exit_code: int = 1


class ConfigError(PaperlabError, ValueError):
    """A bad argument or config value (also a ``ValueError``, so callers may catch either)."""

    exit_code = 2


class NonFiniteLossError(PaperlabError):
    """Training produced a NaN or infinite loss."""
