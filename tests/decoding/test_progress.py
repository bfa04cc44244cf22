"""Progress bars: redrawn rarely when written to a log file, as usual on a terminal."""

from __future__ import annotations

import io

import pytest

from decoding.progress import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_written_to_a_file_redraws_at_most_every_30_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with progress(range(3), desc="x") as bar:
        assert bar.mininterval == 30.0
    monkeypatch.setattr("sys.stderr", Terminal())
    with progress(range(3), desc="x") as bar:
        assert bar.mininterval < 1.0  # tqdm's own default
