"""`python -m dflash.preflight [--world 4x8x80] -- COMMAND ...`

Checks COMMAND (a train, regenerate, eval, prepare, plan, profile or end_to_end command,
as typed: torchrun, python -m or make) the way its real start would, in the world it will
run in (nodes x GPUs a node x GiB a GPU, or cpu), on this machine: no GPU, no weights
(the target's config.json and tokenizer files are all it reads). It prints one screen and
exits 0 when the command would start and fit, 2 with the one line that refuses it.
Several commands (`--file F`, one a line, `#` comments) are checked in order, as a guide
runs them: a prepare's --max-seq-len is what the next train's data holds.
"""
from __future__ import annotations

import argparse
import logging
import sys
import warnings

from dflash.errors import UserError


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dflash.preflight", description=__doc__.split("\n")[0])
    ap.add_argument("--world", default="1x8x80",
                    help="NODESxGPUSxGIB (1x8x80: one 8-GPU node of 80 GB) or cpu")
    ap.add_argument("--file", help="commands to check in order, one a line")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    # transformers' and torch's notes about fake tensors are not the user's business;
    # put back afterwards (main() also runs inside other programs and tests)
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _run(args)
    finally:
        logging.disable(logging.NOTSET)


def _run(args) -> int:
    from dflash.preflight.checks import Session, check
    from dflash.preflight.command import parse
    from dflash.preflight.world import World
    try:
        world = World.parse(args.world)
        texts = [" ".join(a for a in args.command if a != "--")] if args.command else []
        if args.file:
            texts += [ln for ln in open(args.file).read().splitlines()
                      if ln.strip() and not ln.lstrip().startswith("#")]
        if not texts:
            raise UserError("nothing to check: give a command after --, or --file")
        session, failed = Session(), 0
        for text in texts:
            rep = check(parse(text), world, session)
            print(rep.format(), flush=True)
            failed += not rep.ok
    except UserError as exc:
        print(f"dflash: error: {exc}", file=sys.stderr)
        return 2
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
