"""What a preflight found: one screen per command, and a verdict."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Report:
    command: str
    world: str
    app: str = ""
    rows: list = field(default_factory=list)  # (label, text) in the order checked
    memory: object = None  # dflash.preflight.memory.MemoryEstimate (train)
    limit_gib: float | None = None  # usable memory a device (the world's, less headroom)
    decode_gib: float | None = None  # regenerate / eval: weights + KV cache a device
    refused: str | None = None  # the one line the real start (or a device) would refuse with
    unchecked: list = field(default_factory=list)  # what could not be checked here, and why

    def add(self, label: str, text) -> None:
        self.rows.append((label, str(text)))

    @property
    def ok(self) -> bool:
        return self.refused is None

    @property
    def verdict(self) -> str:
        return "ok" if self.ok else f"refused: {self.refused}"

    def peak_text(self) -> str:
        if self.memory is None:
            return "-" if self.decode_gib is None else f"{self.decode_gib:.1f} (decoding)"
        return " / ".join(f"{v:.1f}" for v in self.memory.per_device().values())

    def format(self) -> str:
        lines = [f"preflight: {self.command}", f"{'world':>14}  {self.world}"]
        lines += [f"{label:>14}  {text}" for label, text in self.rows]
        if self.memory is not None:
            for name, gib in self.memory.per_device().items():
                limit = f" of {self.limit_gib:.1f} GiB usable" if self.limit_gib else ""
                lines.append(f"{'peak ' + name:>14}  {gib:.1f} GiB{limit} at rows x length x "
                             f"anchors {' x '.join(map(str, self.memory.shape))}")
            lines += [f"{'':>14}  ({note})" for note in self.memory.notes]
        lines += [f"{'unchecked':>14}  {u}" for u in self.unchecked]
        lines.append(f"{'verdict':>14}  {self.verdict}")
        return "\n".join(lines)


def table(reports: list) -> str:
    """The markdown table of many preflights: command, world, peak a device, verdict."""
    out = ["| command | world | peak GiB a device (target / drafter) | verdict |",
           "| --- | --- | --- | --- |"]
    for r in reports:
        cmd = r.command.replace("|", "\\|")
        out.append(f"| `{cmd}` | {r.world} | {r.peak_text()} | {r.verdict} |")
    return "\n".join(out)
