"""`python -m dflash.eval`: the command users know. The app is `dflash.evaluate` (the
apps' layer); this forwards the command line to it by name, so the eval library package
never imports the layer above it."""
import runpy

runpy.run_module("dflash.evaluate", run_name="__main__", alter_sys=True)
