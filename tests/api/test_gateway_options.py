"""Request options through the gateway: `stop` is passed to the upstream and honoured; log
probabilities, which it cannot give, are refused by name with 422 in OpenAI's shape."""

from __future__ import annotations

import openai
import pytest

from tests.api.test_gateway import (  # the fixtures, reused
    Served,
    ask,
    caller,  # noqa: F401 (a fixture)
    error_of,
    gateway,  # noqa: F401 (a fixture)
    standin,  # noqa: F401 (a fixture)
)
from tests.conftest import Caller

pytestmark = pytest.mark.commits("the gateway serves from a thread; its recorder commits")


def test_stop_is_passed_upstream_and_the_answer_ends_before_it(
    gateway: Served,  # noqa: F811 (the fixture above)
    caller: Caller,  # noqa: F811 (the fixture above)
) -> None:
    answer = gateway.client(caller.key).chat.completions.create(
        model="billing", messages=ask("first. second"), stop=["."]
    )
    assert answer.choices[0].message.content == "reply from standin-base to: first"
    assert answer.choices[0].finish_reason == "stop"
    assert gateway.chats()[0]["body"]["stop"] == ["."]


@pytest.mark.parametrize("options", [{"logprobs": True}, {"top_logprobs": 2}])
def test_log_probabilities_are_refused_by_name_and_reach_no_upstream(
    gateway: Served,  # noqa: F811 (the fixture above)
    caller: Caller,  # noqa: F811 (the fixture above)
    options: dict[str, object],
) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        gateway.client(caller.key).chat.completions.create(
            model="billing",
            messages=ask("x"),
            **options,  # type: ignore[arg-type]
        )
    error = error_of(raised.value)
    assert error["param"] == next(iter(options))
    assert "log probabilities are not supported" in error["message"]
    assert gateway.chats() == []


def test_logprobs_false_is_accepted(
    gateway: Served,  # noqa: F811 (the fixture above)
    caller: Caller,  # noqa: F811 (the fixture above)
) -> None:
    answer = gateway.client(caller.key).chat.completions.create(
        model="billing", messages=ask("x"), logprobs=False
    )
    assert answer.choices[0].message.content == "reply from standin-base to: x"
