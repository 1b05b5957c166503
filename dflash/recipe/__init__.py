"""The real-model recipe (`python -m dflash.end_to_end`, `make train-real`): a drafter for
a real chat model, start to finish, each stage one of dflash's own apps.

    run.py           the stages in order
    stage_config.py  each stage's app config, composed and checked before the first runs
    stages.py        stages a rerun skips; an app's stop or failure
    workdir.py       every file of the workdir, named once
    summary.py       what the stages measured (summary.json) and the printed lines
    estimate.py      the long stages priced on this machine, scaled to a budget
    prompt_gen.py    the seeded prompt sets (prompt_words.py: their vocabulary)
    gguf.py          the packaged SmolLM2 GGUF -> an HF dir
    llama_cpp.py     llama.cpp serving the drafter, checked against dflash's decoding
    engine_speed.py  llama-server's decoding speed with and without the drafter
"""
