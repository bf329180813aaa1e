"""What an exporter's progress callback must have printed: one line per
layer, in order, each once its last tensor is written
(colibri/model/export.py report_layer_written), whatever --jobs."""
from __future__ import annotations

import re


def assert_one_line_per_layer(lines: list[str], n_layers: int) -> None:
    """lines: the progress callback's arguments; the elapsed time, which
    varies, is left out of the comparison."""
    assert n_layers >= 2, "one layer cannot show the order"
    assert [re.sub(r" \(\d+\.\d s\)$", "", x) for x in lines] == [
        f"layer {i}/{n_layers} written" for i in range(1, n_layers + 1)], lines
