"""Which batching strategy should I use? A training sweep's answer, with intervals.

    stats     intervals over seeds, paired verdicts, bootstrap of the eval, crossings
    table     one row per job, one per strategy over its seeds
    report    comparison.md and comparison.png
    callback  the Hydra callback that writes them when a multirun ends
"""
