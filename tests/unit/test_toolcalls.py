"""Tool calls against expected calls, BFCL's way: types, acceptable values, optional
arguments, order-free parallel calls, partial credit. Each case is worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from flywheel.sandbox.toolcalls import (
    as_call,
    compare_calls,
    reference_calls,
    standardise_string,
    value_matches,
)


def tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOLS = [
    tool(
        "triangle_area",
        {"base": {"type": "number"}, "height": {"type": "integer"}, "unit": {"type": "string"}},
        ["base", "height"],
    ),
    tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}, ["city"]),
]
AREA = {"name": "triangle_area", "arguments": {"base": [10.0], "height": [5], "unit": ["cm", ""]}}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def weather(city: str, days: int) -> dict[str, Any]:
    return {"name": "get_weather", "arguments": {"city": [city], "days": [days]}}


def test_an_integer_is_accepted_for_a_number_but_not_a_float_or_text_for_an_integer() -> None:
    assert compare_calls([call("triangle_area", base=10, height=5)], [AREA], TOOLS).matched
    for height in (5.0, "5", True):
        result = compare_calls([call("triangle_area", base=10, height=height)], [AREA], TOOLS)
        assert not result.matched
        assert result.reason == f"triangle_area: height={value_text(height)} is not among [5]"


def value_text(value: object) -> str:
    return {5.0: "5.0", "5": '"5"', True: "true"}[value]  # type: ignore[index]


def test_a_bool_is_not_a_number_even_untyped() -> None:
    assert not value_matches(True, 1)
    assert not value_matches(1, True)
    assert value_matches(False, False)


def test_an_optional_argument_may_be_omitted_or_given_but_a_required_one_not() -> None:
    assert compare_calls([call("triangle_area", base=10, height=5)], [AREA], TOOLS).matched
    given = call("triangle_area", base=10, height=5, unit="CM")  # strings: case folded
    assert compare_calls([given], [AREA], TOOLS).matched
    missing = compare_calls([call("triangle_area", base=10)], [AREA], TOOLS)
    assert (missing.matched, missing.reason) == (False, "triangle_area: missing argument 'height'")


def test_an_argument_the_schema_requires_is_required_even_if_marked_optional() -> None:
    expected = {"name": "get_weather", "arguments": {"city": ["Paris", ""]}}
    result = compare_calls([call("get_weather")], [expected], TOOLS)
    assert result.reason == "get_weather: missing argument 'city'"
    assert reference_calls([expected], TOOLS) == [call("get_weather", city="Paris")]


def test_an_argument_not_expected_fails() -> None:
    result = compare_calls([call("triangle_area", base=10, height=5, colour="red")], [AREA], TOOLS)
    assert result.reason == "triangle_area: unexpected argument 'colour'"


def test_strings_compare_after_bfcl_standardisation() -> None:
    assert standardise_string("New York, NY") == "newyorkny"
    expected = [weather("New York, NY", 3)]
    assert compare_calls([call("get_weather", city="new york ny", days=3)], expected).matched
    assert not compare_calls([call("get_weather", city="Newark", days=3)], expected).matched


def test_parallel_calls_match_in_any_order() -> None:
    expected = [weather("Paris", 1), weather("Rome", 2)]
    calls = [call("get_weather", city="Rome", days=2), call("get_weather", city="Paris", days=1)]
    assert compare_calls(calls, expected, TOOLS).matched


def test_the_matching_is_one_to_one_not_greedy() -> None:
    # The first expected call accepts either city; pairing it greedily with the first call
    # (Paris) would leave Rome's expected call without its call.
    loose = {"name": "get_weather", "arguments": {"city": ["Paris", "Rome"], "days": [1]}}
    calls = [call("get_weather", city="Paris", days=1), call("get_weather", city="Rome", days=1)]
    assert compare_calls(calls, [loose, weather("Paris", 1)], TOOLS).matched


def test_a_duplicate_call_does_not_stand_for_two_expected_calls() -> None:
    expected = [weather("Paris", 1), weather("Rome", 2)]
    twice = [call("get_weather", city="Paris", days=1)] * 2
    result = compare_calls(twice, expected, TOOLS, partial_credit=0.5)
    assert (result.matched, result.name_ok, result.arguments_ok) == (False, True, False)
    assert result.reason == 'get_weather: city="Paris" is not among ["Rome"]'
    assert (result.reward, result.is_partial) == (0.5, True)


def test_an_extra_call_fails_and_earns_no_partial_credit() -> None:
    extra = [call("get_weather", city="Paris", days=1), call("get_weather", city="Rome", days=2)]
    result = compare_calls(extra, [weather("Paris", 1)], TOOLS, partial_credit=0.5)
    assert (result.matched, result.name_ok, result.arguments_ok) == (False, True, True)
    assert result.reason == "2 calls where 1 are expected"
    assert result.reward == 0.0  # calling more tools must not buy credit


def test_an_unknown_function_fails() -> None:
    result = compare_calls(
        [call("get_forecast", city="Paris", days=1)], [weather("Paris", 1)], TOOLS
    )
    assert (result.matched, result.name_ok) == (False, False)
    assert result.reason == "unknown function 'get_forecast'"


def test_no_call_and_a_wrong_name_score_zero_even_with_partial_credit() -> None:
    for calls in ([], [call("triangle_area", base=1, height=1)]):
        result = compare_calls(calls, [weather("Paris", 1)], TOOLS, partial_credit=0.5)
        assert (result.name_ok, result.reward) == (False, 0.0)
        assert result.reason == "no call to 'get_weather'"


def test_partial_credit_for_the_right_name_with_wrong_arguments() -> None:
    calls = [call("get_weather", city="Paris", days=9)]
    assert compare_calls(calls, [weather("Paris", 1)], TOOLS).reward == 0.0
    result = compare_calls(calls, [weather("Paris", 1)], TOOLS, partial_credit=0.3)
    assert (result.reward, result.is_partial, result.reason) == (
        0.3,
        True,
        "get_weather: days=9 is not among [1]",
    )


def test_malformed_arguments_fail_with_a_reason() -> None:
    result = compare_calls([{"name": "get_weather", "arguments": '{"city": "Paris",'}], [])
    assert (result.matched, result.reward) == (False, 0.0)
    assert result.reason.startswith("malformed call: get_weather: arguments are not JSON")
    assert as_call({"name": "f", "arguments": '{"x": 2}'}).arguments == {"x": 2}


def test_lists_compare_element_wise_and_dicts_by_their_acceptable_values() -> None:
    tools = [
        tool(
            "book",
            {
                "ids": {"type": "array", "items": {"type": "integer"}},
                "guest": {"type": "dict", "properties": {"name": {"type": "string"}}},
            },
            ["ids", "guest"],
        )
    ]
    expected = {
        "name": "book",
        "arguments": {"ids": [[1, 2]], "guest": [{"name": ["Ann"], "age": [30, ""]}]},
    }
    assert compare_calls(
        [call("book", ids=[1, 2], guest={"name": "ann"})], [expected], tools
    ).matched
    for ids, guest in (([2, 1], {"name": "Ann"}), ([1, 2.0], {"name": "Ann"}),
                       ([1, 2], {"name": "Ann", "age": 31}), ([1, 2], {"age": 30})):  # fmt: skip
        assert not compare_calls([call("book", ids=ids, guest=guest)], [expected], tools).matched
    assert reference_calls([expected], tools) == [call("book", ids=[1, 2], guest={"name": "Ann"})]


def test_dotted_names_match_their_underscored_form() -> None:
    expected = [{"name": "math.factorial", "arguments": {"n": [5]}}]
    tools = [tool("math.factorial", {"n": {"type": "integer"}}, ["n"])]
    assert compare_calls([call("math_factorial", n=5)], expected, tools).matched
    assert compare_calls([call("math.factorial", n=5)], expected, tools).matched


@pytest.mark.parametrize("tools", [TOOLS, None])
def test_no_expected_call_matches_only_no_call(tools: list[dict[str, Any]] | None) -> None:
    assert compare_calls([], [], tools).matched
    assert not compare_calls([call("get_weather", city="Paris")], [], tools).matched
