"""The one exception type that means "the user's input or options are wrong" (exit status 2)."""


class SortpackError(Exception):
    """A bad input or option, reported as one line and exit status 2.

    ``collective`` is set when every rank raised the same error together (after
    ``Comm.check``), so the job can exit cleanly instead of aborting.
    """

    def __init__(self, message: str, collective: bool = False):
        super().__init__(message)
        self.collective = collective
