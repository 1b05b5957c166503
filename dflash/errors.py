"""User errors: each message names the file, key or sample at fault.

    UserError        anything the user can fix; an app prints it as one line, exit 2
      DataError      bad input data: a file, a line, a sample, a checkpoint
      ConfigError    a setting that cannot work as given (the key is named)
        TopologyError  devices or ranks that do not fit the chosen topology
      ToolError      a program dflash ran failed (a recipe stage's app, llama.cpp's
                     converter or server): what it printed says why

Anything else is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """Bad input or settings, found before any work is lost."""


class DataError(UserError):
    """Bad input data: the message names the file, line or sample."""


class ConfigError(UserError):
    """A setting that cannot work: the message names the key."""


class TopologyError(ConfigError):
    """Devices or ranks that do not fit `topology=`."""


class ToolError(UserError):
    """A subprocess or server failed: the message names it and where its output is."""


def one_line(text, limit: int = 300) -> str:
    """What a library or server said (an exception, a body), on one line for ours."""
    return " ".join(str(text).split())[:limit]


def require(ok: bool, key: str, value, want: str) -> None:
    """A setting outside what can work: one line naming the key, its value and the range."""
    if not ok:
        raise ConfigError(f"{key}={value}: must be {want}")


def check_dir_path(key: str, value) -> None:
    """`key=value` names a directory an app writes into (a cache): a file there or among
    its parents is refused at start (it failed with a traceback when the first entry was
    written). Nothing is created, and a parent's permissions are not judged: preflight
    runs the same check on the machine the job is planned on, whose disks may differ."""
    from pathlib import Path
    path = Path(str(value))
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{key}={value}: a file, not a directory")
    _no_file_above(key, value, path)


def _no_file_above(key: str, value, path) -> None:
    """The nearest existing parent of `path` must be a directory for it to be made."""
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ConfigError(f"{key}={value}: {parent} is a file, not a directory")


def hydra_dirs_checked(main):
    """Outside an app's @hydra.main: a run or sweep dir the command names that cannot be
    a directory (under a file) is one line; Hydra makes it before the app starts, with
    a traceback."""
    import functools
    import sys

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        for arg in sys.argv[1:]:
            key, eq, value = arg.lstrip("+").partition("=")
            if eq and key in ("hydra.run.dir", "hydra.sweep.dir") and "${" not in value:
                try:
                    check_dir_path(key, value)
                except ConfigError as exc:
                    _exit(f"dflash: error: {exc}", 2)
        return main(*args, **kwargs)
    return wrapper


def check_file_path(key: str, value) -> None:
    """`key=value` names a file an app writes at its end: one that cannot be written
    there (a directory, or a parent that is a file) is refused before the work."""
    from pathlib import Path
    if not value:
        return
    path = Path(str(value))
    if path.is_dir():
        raise ConfigError(f"{key}={value}: a directory; give a file's path")
    _no_file_above(key, value, path)


def _exit(line: str, status: int):
    """An app's last word: one line on stderr, then its exit status."""
    import sys
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(status) from None


def _ours(exc: BaseException) -> "UserError | None":
    """The UserError an OmegaConf error wraps: a resolver of ours (the drafter's depth
    from the target's config) refused a value, and its line says it best."""
    for _ in range(8):
        exc = exc.__cause__ or exc.__context__
        if exc is None or isinstance(exc, UserError):
            return exc
    return None


def user_errors_exit(fn):
    """For an app's Hydra task function: a UserError ends the run with its one message
    and exit status 2, not a traceback; Ctrl-C (where the app does not stop on it
    itself, as training does) with one line and status 130, the shell's for SIGINT."""
    import functools

    from omegaconf.errors import (InterpolationResolutionError, MissingMandatoryValue,
                                  ValidationError)
    # a config value met when the app reads it: a `${oc.env:...}` the environment fills
    # with what the schema refuses, a value left `???` (not a key the code misspelled)
    value_errors = (ValidationError, InterpolationResolutionError, MissingMandatoryValue)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            _exit(f"dflash: error: {exc}", 2)
        except value_errors as exc:
            _exit(f"dflash: error: {_ours(exc) or one_line(exc, 400)}", 2)
        except KeyboardInterrupt:
            _exit(f"dflash: {fn.__module__.split('.')[-1]} interrupted (Ctrl-C); what it "
                  "wrote before is kept", 130)
    return wrapper
