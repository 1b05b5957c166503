"""The one error type for bad input: its message names the file, key or sample at fault."""


class DataError(ValueError):
    """Bad input data or settings, found before any work is lost."""
