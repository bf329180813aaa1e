"""`colibri run --engine reference` (colibri/model/run.py) on a small random model:
what it prints, the --logits-out layout, and its errors. Expected values come
from the Reference API directly (tested against transformers elsewhere).
The C engine is tested in tests/test_binding.py."""
from __future__ import annotations

import numpy as np
import pytest

from colibri.cli import main
from colibri.model.reference import Reference
from greedy import assert_margins
from test_reference import SHAPE, write_random_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("run") / "m.colibri", seed=3)


def test_batch_logits_out_holds_valid_rows_in_order(model, tmp_path, capsys):
    out = tmp_path / "l.f32"
    assert main(["run", str(model), "--engine", "reference", "--tokens", "1,2,3,4",
                 "--tokens", "5, 6",
                 "--logits-out", str(out)]) == 0
    rows = np.fromfile(out, dtype="<f4").reshape(-1, SHAPE.vocab)
    ref = Reference(model)
    a = ref.forward([[1, 2, 3, 4]])[0]
    b = ref.forward([[5, 6]])[0]
    np.testing.assert_allclose(rows, np.concatenate([a, b]), atol=1e-5, rtol=0)
    text = capsys.readouterr().out
    # The CLI ran a padded batch, `a` alone (other matrix sizes): the same
    # argmax on every CPU needs margins above rounding, checked first.
    assert_margins(a, what="prompt rows")
    assert "greedy next token per position: " + ",".join(
        str(t) for t in np.argmax(a, axis=-1)) in text
    assert "wrote 6 rows" in text


def test_generate_prints_tokens_and_appends_rows(model, tmp_path, capsys):
    out = tmp_path / "g.f32"
    assert main(["run", str(model), "--engine", "reference", "--tokens", "7,8,9",
                 "--generate", "5",
                 "--logits-out", str(out)]) == 0
    gen, rows = Reference(model).generate([7, 8, 9], 5)
    assert "generated: " + ",".join(map(str, gen)) in capsys.readouterr().out
    np.testing.assert_allclose(np.fromfile(out, dtype="<f4").reshape(-1, SHAPE.vocab),
                               rows, atol=1e-5, rtol=0)
    assert rows.shape[0] == 3 + 5 - 1


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "1,x"], "'x' is not an integer token id"),
    (["--tokens", "1,999"], "token id 999 at [0, 1] is outside the vocabulary"),
    (["--tokens", "1,2", "--tokens", "3", "--generate", "2"], "prompts of equal length"),
    (["--tokens", "1", "--generate", "-1"], "--generate must be >= 0"),
    (["--tokens", ","], "holds no token id"),
])
def test_errors_are_one_line(model, argv, message, capsys):
    assert main(["run", str(model), "--engine", "reference"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("colibri: error: ") and message in err


def test_missing_file_is_an_error(tmp_path, capsys):
    assert main(["run", str(tmp_path / "none.colibri"), "--engine", "reference",
                 "--tokens", "1"]) == 2
    assert "none.colibri" in capsys.readouterr().err
