"""The one error type for bad input: its message names the file, key or sample at fault."""


class DataError(ValueError):
    """Bad input data or settings, found before any work is lost."""


def user_errors_exit(fn):
    """For an app's Hydra task function: an error the user caused (a DataError names the
    file, key or sample) ends the run with that one message and exit status 2, not a
    traceback. Anything else is a bug and keeps its traceback."""
    import functools
    import sys

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DataError as exc:
            print(f"dflash: error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
    return wrapper
