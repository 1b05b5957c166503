"""The Hydra configs of every dflash app (shipped in the wheel)."""
