"""The bench's tables: the shipped default's row marked, the identical column explained, columns aligned."""

from __future__ import annotations

from dataclasses import fields

from decoding.bench.constrained import ConstrainedReport, ConstrainedRow
from decoding.bench.report import BenchReport, Measurement, Row
from decoding.bench.runner import BenchOptions, default_config
from decoding.stats import SpecStats
from tests.conftest import TinyFactory
from tests.decoding.heads import head_for


def _row(name: str, reference: str | None) -> Row:
    m = Measurement(tokens=100, seconds=1.0, compared=8 if reference else 0, identical=8 if reference else 0)
    return Row(name, "all", reference, m, baseline_tps=50.0)


def test_the_default_row_is_marked_and_the_identical_column_explained() -> None:
    rows = [_row("engine target-only", None), _row("engine ngram", "engine target-only"),
            _row("engine ngram+draft tree", "engine target-only")]
    lines = BenchReport(rows, {"default_config": "engine ngram+draft tree"}).table().splitlines()
    marked = [line for line in lines if line.startswith("engine ngram+draft tree *")]
    assert len(marked) == 1 and not any(line.startswith("engine ngram *") for line in lines)
    assert "* the gateway's default for these requests (policies/default.yaml)" in lines
    assert any(line.startswith("identical: ") and "HF's own generate" in line for line in lines)
    # every column past the speed is said in words under the table, not only in the JSON's section
    [legend] = [line for line in lines if line.startswith("speedup: ")]
    assert all(f"{column}: " in legend for column in ("decode", "accept", "acc.len", "pass/tok"))
    # columns stay aligned under the marker: each row's tok/s ends under the header's
    end = lines[0].index("tok/s") + len("tok/s")
    assert all(line[end - 1] != " " and line[end] == " " for line in lines[2:5])
    # no default among the rows (another draft was benched): no marker, no legend for it
    other = BenchReport(rows, {"default_config": None}).table()
    assert " *" not in other and "default for these requests" not in other


def test_the_default_is_the_shipped_heads_tree_behind_lookup_greedy_and_lookup_alone_sampled(
        tiny_model: TinyFactory) -> None:
    head = head_for(tiny_model(), "eagle")
    assert default_config(head, BenchOptions()) == "engine ngram+draft tree"
    assert default_config(head, BenchOptions(temperature=0.7)) == "engine ngram"
    assert default_config(head, BenchOptions(draft="other.safetensors")) is None  # not what the policy serves
    assert default_config(None, BenchOptions()) is None


def test_the_constrained_table_keeps_its_columns_under_a_long_configuration_name() -> None:
    rows = [ConstrainedRow("outlines", name, tokens=200, seconds=1.0, decode_seconds=0.8, requests=20, valid=20,
                           identical=20, baseline_tokens_per_s=100.0, baseline_decode_tokens_per_s=110.0)
            for name in ("target-only", "grammar+ngram+draft")]
    lines = ConstrainedReport(rows=rows, compile_times=[], failures=[]).table().splitlines()
    head, short, long = lines[1], lines[3], lines[4]
    end = head.index("tok/s") + len("tok/s")  # right-aligned: each row's number ends under the header's end
    assert short[end - 1] != " " and long[end - 1] != " " and short[end] == long[end] == " "
    assert len(short) == len(long) == len(head)


def test_merging_stats_adds_every_count() -> None:
    """The bench adds requests' statistics up; a count left out of `merge` (cached prompt tokens were)
    reads 0 in every aggregate."""
    counts = [f.name for f in fields(SpecStats) if f.type in ("int", "float")]
    one, two = SpecStats(**{name: 1 for name in counts}), SpecStats(**{name: 2 for name in counts})
    one.merge(two)
    assert {name: getattr(one, name) for name in counts} == {name: 3 for name in counts}
    assert "cached_prompt_tokens" in counts and "grammar_s" in counts
