"""The one exception type that means "the user's input or options are wrong" (exit status 2)."""
from __future__ import annotations


class SortpackError(Exception):
    """A bad input or option, reported as one line and exit status 2.

    ``collective`` is set when every rank raised the same error together (after
    ``Comm.check``), so the job can exit cleanly instead of aborting.
    """

    def __init__(self, message: str, collective: bool = False):
        super().__init__(message)
        self.collective = collective


def one_line(error: BaseException | str) -> str:
    """Return an error message on one line (whitespace runs become one space).

    An exception without a message is named by its type, so the line is never empty.
    """
    text = " ".join(str(error).split())
    return text or ("" if isinstance(error, str) else type(error).__name__)
