"""The stock-parts bench's rounds and verdicts (bench/bench_stock.py)."""

from __future__ import annotations

from bench.bench_stock import alternating, compare


def test_rounds_alternate_their_order_so_drift_weighs_on_every_configuration_alike():
    assert alternating(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"),
                                          (2, "b")]  # fmt: skip


def test_a_part_is_kept_only_when_every_round_with_it_beats_every_round_without():
    kept = compare([4.0, 4.2, 4.1], [5.0, 5.5, 4.9])
    assert kept["verdict"].startswith("kept")
    assert round(kept["gain_pct"]) == 18  # (5.0 - 4.1) / 5.0
    assert round(kept["spread_pct"]) == 12  # stock: (5.5 - 4.9) / 5.0
    assert compare([4.0, 5.1, 4.1], [5.0, 5.5, 4.9])["verdict"].startswith("within noise")
    assert compare([6.0, 6.1, 6.2], [5.0, 5.5, 4.9])["verdict"] == "stock is better"
    assert compare([4.0, 4.1], [5.0, 5.5])["verdict"] == "too few rounds to judge"
