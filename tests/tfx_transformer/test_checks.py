"""Tests of the checked numbers of configs, flags and constructors (`tfx_transformer.checks`)."""

import numpy as np
import pytest

from tfx_transformer import checks

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("check, value, expected", [
    (checks.positive_int, 3, 3),
    (checks.positive_int, np.int64(2), 2),
    (checks.non_negative_int, 0, 0),
    (checks.positive_number, 2, 2.0),
    (checks.positive_number, 1e-9, 1e-9),
    (checks.non_negative_number, 0, 0.0),
    (checks.fraction, 0, 0.0),
    (checks.fraction, 0.999, 0.999),
])
def test_good_values_are_returned(check, value, expected):
    result = check("x", value)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize("check, value, expected", [
    (checks.positive_int, 0, "a positive integer"),
    (checks.positive_int, -1, "a positive integer"),
    (checks.positive_int, True, "a positive integer"),
    (checks.positive_int, 2.0, "a positive integer"),
    (checks.positive_int, "3", "a positive integer"),
    (checks.positive_int, None, "a positive integer"),
    (checks.non_negative_int, -1, "a non-negative integer"),
    (checks.non_negative_int, False, "a non-negative integer"),
    (checks.positive_number, 0, "a positive number"),
    (checks.positive_number, -0.5, "a positive number"),
    (checks.positive_number, True, "a positive number"),
    (checks.positive_number, NAN, "a positive number"),
    (checks.positive_number, INF, "a positive number"),
    (checks.positive_number, "1", "a positive number"),
    (checks.non_negative_number, -1e-9, "a non-negative number"),
    (checks.fraction, 1.0, "a number in [0, 1)"),
    (checks.fraction, -0.1, "a number in [0, 1)"),
    (checks.fraction, NAN, "a number in [0, 1)"),
    (checks.fraction, None, "a number in [0, 1)"),
    (checks.boolean, 1, "True or False"),
    (checks.boolean, "yes", "True or False"),
])
def test_bad_values_name_the_argument_and_the_value(check, value, expected):
    with pytest.raises(ValueError) as info:
        check("x", value)
    assert str(info.value) == f"`x` must be {expected}. Received: x={value!r}"
    assert info.value.expected == expected


@pytest.mark.parametrize("check", [checks.positive_int, checks.non_negative_int,
                                   checks.positive_number, checks.fraction])
def test_optional_accepts_none_and_says_so(check):
    assert check("x", None, optional=True) is None
    with pytest.raises(ValueError, match=r"^`x` must be None or a .*Received: x=-1$"):
        check("x", -1, optional=True)


def test_bounds_and_intervals():
    assert checks.integer("x", 5, minimum=5, maximum=5) == 5
    for value, message in ((4, "an integer >= 5"), (2**32, "an integer in [0, 4294967295]")):
        with pytest.raises(ValueError, match=rf"must be {message.replace('[', '.')}\. "):
            checks.integer("x", value, minimum=5 if value == 4 else 0,
                           maximum=None if value == 4 else 2**32 - 1)
    assert checks.fraction("x", 1, interval="(]") == 1.0
    with pytest.raises(ValueError, match=r"must be a number in \(0, 1\]\. Received: x=0$"):
        checks.fraction("x", 0, interval="(]")
    with pytest.raises(ValueError, match=r"must be a number > 2\. Received: x=2$"):
        checks.number("x", 2, minimum=2, interval="(]")


def test_a_dotted_name_keeps_its_owner_in_the_first_part_only():
    with pytest.raises(ValueError) as info:
        checks.positive_int("NMTConfig.d_model", 0)
    assert str(info.value) == "`NMTConfig.d_model` must be a positive integer. Received: d_model=0"


def test_positive_ints():
    assert checks.positive_ints("filters", [8, np.int32(16)]) == (8, 16)
    assert checks.positive_ints("pad_to", None, length=2, optional=True) is None
    for values in ((), (8, 0), (8, True), "ab", (8.0,)):
        with pytest.raises(ValueError, match=r"^`filters` must be a non-empty sequence of "
                                             r"positive integers\. Received: filters="):
            checks.positive_ints("filters", values)
    with pytest.raises(ValueError, match=r"a sequence of 2 positive integers\. "
                                         r"Received: pad_to=\(1, 2, 3\)$"):
        checks.positive_ints("pad_to", (1, 2, 3), length=2)
