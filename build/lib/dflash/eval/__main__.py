"""`python -m dflash.eval`: see dflash.eval.app."""
from dflash import config

config.register()

from dflash.eval.app import main  # noqa: E402

main()
