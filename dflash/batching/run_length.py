"""How long a run is: this rank's shard of each epoch, steps per epoch, the run's total
(epochs capped by optim.max_steps and optim.max_tokens) and where a resume starts.

The greedy rule packs each epoch's shuffle anew, so the step count varies by epoch: the
run's length is summed over the epochs it covers, and every rank derives the same total
from the full plans (no communication).
"""
from __future__ import annotations

import numpy as np

from dflash.batching.distributed import shard
from dflash.errors import ConfigError
from dflash.options import choice


class RunLength:
    def __init__(self, planner, rank: int, world_size: int, batching, seed: int):
        self.planner, self.rank, self.world_size, self.seed = planner, rank, world_size, seed
        self.remainder, self.balance = choice(batching.remainder), bool(batching.balance_steps)
        self.attention_cost = float(batching.attention_cost)
        self._steps: dict[int, int] = {}
        self.total_steps = self.num_epochs = 0

    @classmethod
    def build(cls, cfg, planner, rank: int, world_size: int) -> "RunLength":
        """The run's length from `epochs`, `optim.max_steps` and `optim.max_tokens`."""
        r = cls(planner, rank, world_size, cfg.batching, int(cfg.seed))
        r.total_steps = r._total(int(cfg.epochs), int(cfg.optim.max_steps),
                                 int(cfg.optim.max_tokens))
        r.num_epochs = r.epochs_for(r.total_steps)
        return r

    def shard(self, epoch: int):
        """This rank's batches of `epoch`, in step order."""
        return shard(self.planner.epoch(epoch), self.rank, self.world_size, self.remainder,
                     self.balance, self.attention_cost, self.seed)

    def epoch_steps(self, epoch: int) -> int:
        if epoch not in self._steps:
            self._steps[epoch] = self.shard(epoch).num_batches
        return self._steps[epoch]

    @property
    def steps_per_epoch(self) -> int:
        return self.epoch_steps(0)

    def _total(self, epochs: int, max_steps: int, max_tokens: int) -> int:
        """The epochs' steps, capped by max_steps and max_tokens (epochs <= 0 with a cap:
        the cap)."""
        limit = max_steps if max_steps > 0 else None
        if max_tokens > 0:
            by_tokens = self.steps_for_tokens(max_tokens, limit or 1 << 62)
            limit = by_tokens if limit is None else min(limit, by_tokens)
        if epochs <= 0 and limit is not None:
            total = limit
        else:
            total = 0
            for e in range(max(0, epochs)):
                total += self.epoch_steps(e)
                if limit is not None and total >= limit:
                    break
            total = total if limit is None else min(total, limit)
        if total < 1:
            raise ConfigError(f"nothing to train: epochs={epochs}, "
                              f"{self.steps_per_epoch} steps per epoch")
        return total

    def epochs_for(self, steps: int) -> int:
        """Epochs the first `steps` steps reach into."""
        done, epoch = 0, 0
        while done < steps:
            done, epoch = done + self.epoch_steps(epoch), epoch + 1
        return epoch

    def steps_for_tokens(self, budget: int, limit: int) -> int:
        """Steps until every rank together has trained on `budget` real tokens, from the
        full epoch plans (the same on every rank, so all ranks stop at the same step)."""
        steps, seen, epoch = 0, 0, 0
        while steps < limit:
            plan = self.planner.epoch(epoch)
            cum = seen + np.cumsum(plan.num_tokens, dtype=np.int64)
            if cum[-1] >= budget:
                k = int(np.searchsorted(cum, budget)) + 1  # batches needed
                return min(limit, steps + -(-k // self.world_size))
            seen, steps, epoch = int(cum[-1]), steps + self.epoch_steps(epoch), epoch + 1
        return limit

    def next_position(self, batch) -> tuple[int, int]:
        """(epoch, batch index) of the batch after this one: where a resume starts."""
        if batch.index + 1 >= self.epoch_steps(batch.epoch):
            return batch.epoch + 1, 0
        return batch.epoch, batch.index + 1
