"""The errors a user can fix. `python -m sweep` prints each as one line and exits 2."""


class SweepError(Exception):
    """A problem the user can fix; str() is one line naming the bad value and what is valid."""
