"""Where the repository and its shipped configs are."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "dflash" / "conf"
