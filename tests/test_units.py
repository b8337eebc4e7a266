import pytest

from gpuplatform.units import (
    format_duration_s,
    format_memory_mb,
    parse_duration_s,
    parse_memory_mb,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (24576, 24576),
        ("24Gi", 24576),
        ("24GiB", 24576),
        ("24 gib", 24576),
        ("20480Mi", 20480),
        ("512MiB", 512),
        ("1Ti", 1024 * 1024),
        ("1.5Gi", 1536),
        ("2048Ki", 2),
        # Decimal units are exact bytes rounded down to whole MiB: 24e9 / 2**20 = 22888.18...
        ("24G", 22888),
        ("24GB", 22888),
        ("24000M", 22888),
        ("  24Gi  ", 24576),
    ],
)
def test_it_parses_memory_sizes_into_mib(value: object, expected: int) -> None:
    assert parse_memory_mb(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("abc", "expected a size such as 24Gi or 20480Mi, got 'abc'"),
        ("24Xi", "unknown unit 'xi'"),
        ("24576", "needs a unit"),
        ("-1Gi", "expected a size"),
        (-5, "must be at least 1 MiB"),
        (0, "must be at least 1 MiB"),
        ("0Gi", "must be at least 1 MiB"),
        ("512Ki", "must be at least 1 MiB"),
        (True, "got True"),
        (1.5, "got 1.5"),
        (None, "got None"),
    ],
)
def test_it_rejects_bad_memory_sizes_with_the_reason(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match="^gpu memory: ") as caught:
        parse_memory_mb(value, field="gpu memory")
    assert reason in str(caught.value)


def test_it_leaves_the_field_name_out_when_asked() -> None:
    with pytest.raises(ValueError, match="^expected a size"):
        parse_memory_mb("abc", field="")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (45, 45),
        ("90", 90),
        ("30s", 30),
        ("5m", 300),
        ("6h", 21600),
        ("2d", 172800),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("1d2h3m4s", 93784),
        (" 6H ", 21600),
    ],
)
def test_it_parses_durations_into_seconds(value: object, expected: int) -> None:
    assert parse_duration_s(value) == expected


@pytest.mark.parametrize(
    "value",
    ["", "abc", "5ms", "30m1h", "1h1h", "1.5h", "-5s", "0s", "0", 0, -3, True, 2.5, None],
)
def test_it_rejects_bad_or_non_positive_durations(value: object) -> None:
    with pytest.raises(ValueError, match="^interval: "):
        parse_duration_s(value, field="interval")


@pytest.mark.parametrize(
    ("mb", "expected"),
    [
        (24576, "24 GiB"),
        (512, "512 MiB"),
        (1024 * 1024, "1 TiB"),
        (24564, "24.0 GiB"),
        (1536, "1.5 GiB"),
        (0, "0 MiB"),
    ],
)
def test_it_formats_memory_for_people(mb: int, expected: str) -> None:
    assert format_memory_mb(mb) == expected


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(21600, "6h"), (5400, "1h30m"), (45, "45s"), (93784, "1d2h3m4s"), (0, "0s")],
)
def test_it_formats_durations_compactly(seconds: int, expected: str) -> None:
    assert format_duration_s(seconds) == expected


@pytest.mark.parametrize("seconds", [1, 59, 60, 3601, 5400, 86400, 93784])
def test_it_reads_back_every_duration_it_formats(seconds: int) -> None:
    assert parse_duration_s(format_duration_s(seconds)) == seconds


def test_parse_errors_speak_the_active_language_and_keep_the_field():
    from django.utils import translation

    with translation.override("zh-hans"), pytest.raises(ValueError) as error:
        parse_duration_s("soon", field="timeout")
    assert str(error.value) == "timeout: 应为30s、5m、6h 或 1h30m 这样的时长，实际为 'soon'"
    with pytest.raises(ValueError, match=r"^timeout: expected a duration such as 30s"):
        parse_duration_s("soon", field="timeout")
