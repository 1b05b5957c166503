"""A training run's life on disk: its dir (dir.py: drafter, summary, config, prompts),
who it is (identity.py: what a resume must match, its checkpointer), and stopping and
going on (stop.py: a finished run reused, the continue command, a stop in a sweep).
The apps only wire these together."""
