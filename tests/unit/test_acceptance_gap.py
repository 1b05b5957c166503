"""The acceptance figures side by side, the decode-path walk, and when a mismatch is flagged."""
import numpy as np
import pytest

from dflash.eval.teacher_forced import (acceptance_gap, decode_path, decoded_per_position,
                                        format_gap)


def test_decoded_per_position_is_the_share_accepting_at_least_k():
    # 4 verify steps accepting 1, 2, 2 and 4 tokens (block size 4: up to 3 drafts)
    assert decoded_per_position([1, 2, 0, 1]) == pytest.approx([0.75, 0.25, 0.25])
    assert decoded_per_position([0, 0, 0]) == [0.0, 0.0]


def test_the_decode_path_steps_over_accepted_tokens_and_clamps_at_the_end():
    # 8 tokens; streaks of the blocks anchored at tokens 0..6
    streaks = np.array([0, 3, 9, 9, 9, 1, 0])
    # token 0: 1; token 1: 1 + 3 = 4 (tokens 1-4); token 5: 1 + 1 = 2; token 7: the last, 1
    assert decode_path(streaks) == [1, 4, 2, 1]
    assert sum(decode_path(streaks)) == 8
    assert decode_path(np.array([15, 15])) == [3]  # clamped to the 3 tokens there are
    assert decode_path(np.array([], dtype=np.int64)) == [1]


def test_a_decode_path_estimate_above_decoding_is_a_mismatch_warning():
    tf = {"acceptance_length": 9.0, "per_position": [0.9, 0.8, 0.7],
          "decode_path_acceptance_length": 5.0, "decode_path_per_position": [0.8, 0.6, 0.4]}
    ok = acceptance_gap(10.0, tf, {"acceptance_length": 4.8, "histogram": [1, 1, 1, 2]}, 0.0)
    assert ok["warning"] is None and ok["heldout_decoded_per_position"] == pytest.approx([0.8, 0.6, 0.4])
    assert (ok["train_teacher_forced"], ok["heldout_teacher_forced"], ok["heldout_decode_path"],
            ok["heldout_decoded"]) == (10.0, 9.0, 5.0, 4.8)
    bad = acceptance_gap(10.0, tf, {"acceptance_length": 2.0, "histogram": [3, 1, 0, 0]}, 0.0)
    assert "train/serve mismatch" in bad["warning"] and "mask token" in bad["warning"]
    table = format_gap(bad)
    assert "WARNING" in table and "9.000" in table and "5.000" in table and "2.000" in table
    # sampling accepts by another rule: the figures are shown, no warning drawn from them
    assert acceptance_gap(10.0, tf, {"acceptance_length": 2.0, "histogram": [3, 1, 0, 0]},
                          0.7)["warning"] is None
