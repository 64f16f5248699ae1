"""Every error sweep raises on purpose, in one module (tests/test_layout.py holds the code to it).

`SweepError` is what a user can fix: `python -m sweep` prints it as one line and exits 2. The
others keep the bases their callers catch them by (ValueError, say). Import them from here only
(tests/test_layout.py checks): the modules that raise them no longer re-export them.
This module imports nothing, so the pure core may import it.
"""


class SweepError(Exception):
    """A problem the user can fix; str() is one line naming the bad value and what is valid."""


class SpaceError(ValueError):
    """A batch-size setting that no candidate can satisfy; the message is one line for users."""


class ResultError(ValueError):
    """A result file that cannot be read; the message names the file and what is wrong."""


class ThroughputError(ValueError):
    """A figure that cannot become a throughput with what is known; one line naming what is missing."""


class TemplateError(ValueError):
    """A command template that cannot be filled; one line naming the bad part."""


class LoadError(ValueError):
    """Sweep results that cannot be read; the message is one line naming the path and what to do."""


class ReportError(ValueError):
    """Bad input for the report; one line naming the path and what is expected."""


class UsageError(Exception):
    """A bad command line of a helper command (`python -m sweep.logs`): one line, exit 2."""


class NotRegularFileError(OSError):
    """A path that should be a file is a FIFO, a device or a socket (reading it could block forever)."""


class IncomparableSweepsWarning(UserWarning):
    """compare() lined up sweeps whose (accum, split) pairs mean different per-device batches."""
