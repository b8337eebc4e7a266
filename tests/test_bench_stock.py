"""The stock-parts bench's rounds and verdicts (bench/bench_stock.py)."""

from __future__ import annotations

from bench.bench_stock import alternating, compare, wins_needed


def test_rounds_alternate_their_order_so_drift_weighs_on_every_configuration_alike():
    assert alternating(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"),
                                          (2, "b")]  # fmt: skip


def test_a_part_is_kept_only_when_it_won_more_paired_rounds_than_noise_would():
    assert [wins_needed(n) for n in (3, 4, 5, 6, 8)] == [None, None, 5, 6, 7]
    kept = compare([4.0, 4.2, 4.1, 4.4, 4.0], [5.0, 5.5, 4.9, 4.5, 4.0])
    assert kept["verdict"] == "within noise (4 of 5): use stock"  # a tie is no win
    assert round(kept["gain_pct"]) == 16  # the median of the rounds' gains: (4.9 - 4.1) / 4.9
    assert round(kept["spread_pct"]) == 31  # stock's, the larger: (5.5 - 4.0) / 4.9
    kept = compare([4.0, 4.2, 4.1, 4.4, 4.0], [5.0, 5.5, 4.9, 4.5, 4.1])
    assert kept["verdict"] == "kept: won 5 of 5 rounds"
    # Paired: a slow round slows both, and the part still wins each.
    assert compare([4.0, 9.0, 4.0, 4.0, 4.0], [4.5, 9.5, 4.5, 4.5, 4.5])["rounds_won"] == 5
    assert compare([6.0] * 5, [5.0] * 5)["verdict"] == "stock is better: won 5 of 5"
    assert compare([4.0] * 4, [5.0] * 4)["verdict"] == "too few rounds to judge"
