"""The regeneration job: conversations -> batches -> backend -> parts -> merged JSONL.

Prompts are batched by length with dflash's own planner (`sorted`: a token budget over
prompt + max_new_tokens and a batch cap, as in training), so a batch's KV cache is not
padded to its longest stranger. Ranks (torchrun, or SLURM through the launcher) take
batches i with i % world_size == rank; every rank waits for a round's parts before the
next round (turns=each), and rank 0 merges the output.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from dflash.batching.strategies import PackingSpec, Planner
from dflash.errors import DataError
from dflash.generation.parts import PartStore, files_identity, input_identity, write_jsonl
from dflash.generation.requests import (num_rounds, output_record, read_conversations,
                                        requests_for_round, split_reasoning, tokenize)

log = logging.getLogger("dflash.regenerate")
MAX_LISTED = 100


def plan_batches(reqs: list, max_new_tokens: int, token_budget: int, max_batch_size: int,
                 seed: int = 0) -> list:
    """Index lists into `reqs`, length-sorted batches within the token budget."""
    if not reqs:
        return []
    lengths = np.asarray([len(r.prompt_ids) + max_new_tokens for r in reqs], dtype=np.int64)
    if lengths.max() > token_budget:
        raise DataError(f"batching.token_budget={token_budget} is below one prompt + "
                        f"max_new_tokens ({int(lengths.max())} tokens)")
    spec = PackingSpec(token_budget=int(token_budget), max_batch_size=int(max_batch_size))
    plan = Planner("sorted", lengths, np.array([0, int(lengths.max()) + 1]), spec, seed=seed).epoch(0)
    return [plan.indices[a:b].tolist() for a, b in zip(plan.offsets[:-1], plan.offsets[1:])]


class Regeneration:
    def __init__(self, cfg, backend, tok, rank: int = 0, world_size: int = 1, barrier=None,
                 logger=None, writer: bool | None = None):
        """`rank`/`world_size`: this replica among the target replicas (under
        topology.target_tp a replica is a TP group, whose ranks run the same batches);
        `writer`: whether this process writes the merged output (default: rank 0)."""
        self.cfg, self.backend, self.tok = cfg, backend, tok
        self.rank, self.world = int(rank), int(world_size)
        self.writer = self.rank == 0 if writer is None else bool(writer)
        self.barrier = barrier or (lambda: None)
        self.logger = logger
        self.takes_messages = bool(backend.takes_messages)

    def manifest(self) -> dict:
        c = self.cfg
        return {"inputs": input_identity(c.inputs), "turns": str(c.turns),
                "format": str(c.format),
                "chat_template_kwargs": dict(c.chat_template_kwargs),
                "temperature": float(c.temperature), "top_p": float(c.top_p),
                "max_new_tokens": int(c.max_new_tokens), "seed": int(c.seed),
                "backend": str(c.backend), "model": str(c.model.target.path),
                "drafter": c.drafter, "world_size": self.world,
                "batching": [int(c.batching.token_budget), int(c.batching.max_batch_size)],
                # everything else that changes a reply: the target's dtype and build, the
                # decoder (bf16 greedy differs between decoders at near ties), the drafter's
                # and the template's files, the server, the length policy
                "target": {k: v for k, v in OmegaConf.to_container(c.model.target, resolve=True).items()
                           if k not in ("cache_mb", "build_device")},
                "decoding": str(c.decoding), "tokenizer": c.tokenizer,
                "max_seq_len": int(c.max_seq_len), "truncated": str(c.truncated),
                "model_files": files_identity(c.tokenizer or c.model.target.path),
                "drafter_files": files_identity(c.drafter),
                "served_model": str(c.openai.model) if self.takes_messages else None}

    def run(self, out: Path) -> dict:
        c = self.cfg
        t0 = time.perf_counter()
        convs, skipped = read_conversations(c.inputs, str(c.bad_lines), str(c.format))
        lines_read = len(convs) + len(skipped)  # non-empty input lines
        store = PartStore(Path(str(out) + ".parts"), self.manifest())
        dropped: set = set()
        results: dict = {}
        stats = {"generated_tokens_this_run": 0, "batches_this_run": 0, "batches_resumed": 0,
                 "failed_requests_retried": 0}
        for rnd in range(num_rounds(convs, str(c.turns))):
            reqs, batches = self.round_batches(convs, rnd, dropped, skipped)
            self.run_batches(store, rnd, reqs, batches, stats)
            self.barrier()  # every rank's parts of this round are on disk
            done = store.read_round(rnd, len(batches))
            for r in reqs:
                self.apply(done[r.key], r, convs[r.conversation], dropped, skipped, results)
        return self.finish(out, convs, dropped, skipped, results, stats, lines_read,
                           time.perf_counter() - t0)

    def round_batches(self, convs, rnd: int, dropped: set, skipped: list) -> tuple[list, list]:
        """Round `rnd`'s requests (a conversation whose prompt is unusable is dropped and
        its line named) and their batches."""
        c = self.cfg
        asked = requests_for_round([x for x in convs if x.index not in dropped], str(c.turns), rnd)
        if self.takes_messages:  # the server renders the template: fixed-size chunks, in order
            size = max(1, 4 * int(c.openai.concurrency))
            return asked, [list(range(i, min(len(asked), i + size)))
                           for i in range(0, len(asked), size)]
        reqs, bad = tokenize(asked, self.tok, dict(c.chat_template_kwargs),
                             int(c.max_new_tokens), int(c.max_seq_len))
        if bad and str(c.bad_lines) == "error":
            raise DataError(f"{bad[0]['where']}: {bad[0]['reason']}")
        skipped += bad
        dropped |= {r.conversation for r in asked} - {r.conversation for r in reqs}
        return reqs, plan_batches(reqs, int(c.max_new_tokens), int(c.batching.token_budget),
                                  int(c.batching.max_batch_size), int(c.seed))

    def run_batches(self, store, rnd: int, reqs: list, batches: list, stats: dict) -> None:
        """This rank's batches of the round that have no part yet, each written as a part,
        and the failed requests of those that have one."""
        from tqdm.auto import tqdm
        mine = [i for i in range(len(batches)) if i % self.world == self.rank]
        bar = tqdm(total=sum(len(batches[i]) for i in mine), desc=f"regenerate round {rnd}",
                   unit="prompt", disable=not (self.cfg.progress and self.writer))
        t0, tokens = time.perf_counter(), 0
        for i in mine:
            todo = batches[i]
            if store.done(rnd, i):
                rows = {r["key"]: r for r in store.read_part(rnd, i)}
                todo = [j for j in batches[i] if "error" in rows[reqs[j].key]]
                if not todo:
                    stats["batches_resumed"] += 1
                    bar.update(len(batches[i]))
                    continue
                stats["failed_requests_retried"] += len(todo)
            else:
                rows = {}
            new = self.generate([reqs[j] for j in todo], i)
            rows.update({r["key"]: r for r in new})
            store.write(rnd, i, [rows[reqs[j].key] for j in batches[i]])
            n = sum(r.get("tokens", 0) for r in new)
            tokens += n
            stats["generated_tokens_this_run"] += n
            stats["batches_this_run"] += 1
            rate = tokens / max(time.perf_counter() - t0, 1e-9)
            bar.update(len(batches[i]))  # counted when written, not when started
            bar.set_postfix(tok_s=f"{rate:.0f}")
            if self.logger is not None:
                self.logger.log({"round": rnd, "batch": i, "generated_tokens": n,
                                 "tokens_per_second": rate}, stats["batches_this_run"])
        bar.close()

    def apply(self, row: dict, req, conv, dropped: set, skipped: list, results: dict) -> None:
        """A generated reply into its conversation (a failed request or, under
        truncated=drop, a cut-off reply drops the conversation)."""
        if "error" in row:
            skipped.append({"where": req.where, "reason": row["error"]})
            dropped.add(req.conversation)
            return
        if row["finish_reason"] == "length" and str(self.cfg.truncated) == "drop":
            dropped.add(req.conversation)
        results[req.key] = row
        msg = split_reasoning(row["text"])
        if row.get("reasoning"):
            msg["reasoning_content"] = row["reasoning"]
        conv.replies[req.turn] = msg

    def generate(self, reqs: list, batch_index: int) -> list:
        return self.backend.generate(reqs, batch_index)

    def finish(self, out, convs, dropped, skipped, results, stats, lines_read, seconds) -> dict:
        c = self.cfg
        kept = [x for x in convs if x.index not in dropped]
        truncated = {k for k, r in results.items() if r["finish_reason"] == "length"}
        report = {"conversations_read": lines_read, "conversations_written": len(kept),
                  "lines_skipped": len(skipped), "skipped": skipped[:MAX_LISTED],
                  "truncated": len(truncated), "truncated_policy": str(c.truncated),
                  "truncated_dropped": len({int(k.split("/")[0]) for k in truncated} & dropped),
                  "generated_tokens": int(sum(r["tokens"] for r in results.values())),
                  "seconds": seconds, **stats,
                  "tokens_per_second": stats["generated_tokens_this_run"] / max(seconds, 1e-9),
                  "decoding": self.backend.decoding,
                  "output": str(out)}
        if self.writer:
            kwargs = dict(c.chat_template_kwargs)
            write_jsonl(out, [output_record(x, str(c.turns), results, kwargs) for x in kept])
            Path(str(out) + ".report.json").write_text(json.dumps(report, indent=2))
        return report
