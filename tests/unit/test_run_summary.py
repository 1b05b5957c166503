"""summary.json is one typed record: a key it does not declare is refused at write time."""
import pytest

from dflash.run_summary import FIELDS, check_summary


def test_a_summary_holds_only_declared_fields(tmp_path):
    from dflash.run.dir import write_summary
    write_summary(tmp_path, {"steps": 3, "final_loss": 1.5, "model": {}})
    assert (tmp_path / "summary.json").exists()
    with pytest.raises(KeyError, match="stepz"):
        check_summary({"steps": 3, "stepz": 3})
    assert {"steps", "tokens_per_second", "acceptance_length", "stage_ms"} <= FIELDS
