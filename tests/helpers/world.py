"""`python -m tests.helpers.world CACHE`: fit the suite's small world (its target and
training data) into CACHE. The session starts this in the background when an
integration test needs the world, so the ~1 min fit runs beside the unit tests."""
import sys

from dflash import config
from dflash.sources.build import build_sources
from tests.helpers.run import train_config

if __name__ == "__main__":
    config.register()
    build_sources(train_config(sys.argv[1]), progress=False)
