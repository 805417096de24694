"""The group-aware split: no group straddles train and eval, once eval always eval, and the
same groups give the same split everywhere (properties checked with hypothesis)."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.datasets.split import Split, assign_groups, hashed_split, position_of
from flywheel.errors import InvalidInput

DOMAIN = uuid.UUID("00000000-0000-4000-8000-000000000001")
GROUPS = st.lists(st.text(min_size=1, max_size=12), max_size=60)
FRACTIONS = st.floats(min_value=0.0, max_value=0.95)


Item = tuple[str, str]  # (group key, item)


def build(items: list[Item], assigned: dict[str, Split], fraction: float) -> dict[str, set[Item]]:
    """What a dataset build does with the split: place new groups, then every item by its
    group. Returns the items of each split; `assigned` grows as a build's would."""
    assigned.update(assign_groups(DOMAIN, assigned, (group for group, _ in items), fraction))
    splits: dict[str, set[Item]] = {"train": set(), "eval": set()}
    for group, item in items:
        splits[assigned[group]].add((group, item))
    return splits


@settings(max_examples=200, deadline=None)
@given(
    versions=st.lists(
        st.tuples(
            st.lists(st.tuples(st.text(max_size=8), st.text(max_size=4)), max_size=40), FRACTIONS
        ),
        min_size=1,
        max_size=3,
    )
)
def test_no_group_straddles_and_eval_never_shrinks_or_leaks(
    versions: list[tuple[list[tuple[str, str]], float]],
) -> None:
    """Successive builds, each with more items (old ones kept) and any eval fraction."""
    assigned: dict[str, Split] = {}
    items: list[tuple[str, str]] = []
    ever_eval: set[Item] = set()
    ever_train_groups: set[str] = set()
    for new_items, fraction in versions:
        items += new_items
        splits = build(items, assigned, fraction)
        train_groups = {group for group, _ in splits["train"]}
        eval_groups = {group for group, _ in splits["eval"]}
        assert not train_groups & eval_groups
        assert ever_eval <= splits["eval"]  # eval is append-only
        assert not ever_eval & splits["train"]  # once eval, never train
        assert not ever_train_groups & eval_groups  # trained-on groups never become eval
        ever_eval |= splits["eval"]
        ever_train_groups |= train_groups


@given(groups=GROUPS, fraction=FRACTIONS)
def test_the_split_is_a_function_of_domain_and_group(groups: list[str], fraction: float) -> None:
    first = assign_groups(DOMAIN, {}, groups, fraction)
    second = assign_groups(DOMAIN, {}, reversed(groups), fraction)
    assert first == second
    assert set(first) == set(groups)


def test_the_eval_share_follows_the_fraction() -> None:
    groups = [f"ticket:{number}" for number in range(20_000)]
    placed = assign_groups(DOMAIN, {}, groups, 0.1)
    share = sum(split == "eval" for split in placed.values()) / len(groups)
    assert 0.09 < share < 0.11
    other_domain = assign_groups(uuid.uuid4(), {}, groups, 0.1)
    assert placed != other_domain  # domains are split independently


def test_assigned_groups_are_never_revisited() -> None:
    assigned: dict[str, Split] = {"a": "eval", "b": "train"}
    assert assign_groups(DOMAIN, assigned, ["a", "b", "c"], 0.99) == {
        "c": hashed_split(DOMAIN, "c", 0.99)
    }


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 2.0])
def test_a_fraction_outside_zero_one_is_refused(fraction: float) -> None:
    with pytest.raises(InvalidInput, match="eval fraction"):
        hashed_split(DOMAIN, "g", fraction)


def test_a_minimum_fills_eval_first_in_position_order() -> None:
    """A pilot: 15 groups of 2 items; the fraction's own eval groups count towards the
    minimum, and the next groups by position make up the rest."""
    groups = [f"ticket:{number}" for number in range(15)]
    by_position = sorted(groups, key=lambda key: position_of(DOMAIN, key))
    natural = [key for key in groups if hashed_split(DOMAIN, key, 0.1) == "eval"]
    sizes = dict.fromkeys(groups, 2)
    wanted = 2 * len(natural) + 5  # three more groups: 6 items, the last one 1 past the minimum

    placed = assign_groups(DOMAIN, {}, groups, 0.1, eval_shortfall=wanted, sizes=sizes)

    assert [key for key in by_position if placed[key] == "eval"] == by_position[: len(natural) + 3]
    assert placed == assign_groups(
        DOMAIN, {}, reversed(groups), 0.1, eval_shortfall=wanted, sizes=sizes
    )


def test_a_minimum_never_moves_a_placed_group() -> None:
    assigned: dict[str, Split] = {"old-1": "train", "old-2": "train"}
    placed = assign_groups(DOMAIN, assigned, ["old-1", "old-2", "new-1", "new-2"], 0.0,
                           eval_shortfall=1)  # fmt: skip
    assert set(placed) == {"new-1", "new-2"}
    assert sorted(placed.values()) == ["eval", "train"]


@settings(max_examples=200, deadline=None)
@given(
    versions=st.lists(
        st.tuples(
            st.lists(st.tuples(st.text(max_size=6), st.text(max_size=3)), max_size=30),
            FRACTIONS,
            st.integers(min_value=0, max_value=20),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_a_minimum_keeps_every_guarantee_and_is_met_when_new_groups_allow(
    versions: list[tuple[list[tuple[str, str]], float, int]],
) -> None:
    """Successive builds, each with its own fraction and minimum (in items)."""
    assigned: dict[str, Split] = {}
    items: list[Item] = []
    ever_eval: set[Item] = set()
    ever_train_groups: set[str] = set()
    for new_items, fraction, minimum in versions:
        items += new_items
        sizes = Counter(group for group, _ in set(items))
        in_eval = sum(n for group, n in sizes.items() if assigned.get(group) == "eval")
        new = assign_groups(DOMAIN, assigned, sizes, fraction,
                            eval_shortfall=max(0, minimum - in_eval), sizes=sizes)  # fmt: skip
        assert set(new).isdisjoint(assigned)
        assigned.update(new)
        splits: dict[str, set[Item]] = {"train": set(), "eval": set()}
        for group, item in items:
            splits[assigned[group]].add((group, item))
        eval_groups = {group for group, _ in splits["eval"]}
        assert ever_eval <= splits["eval"]
        assert not ever_train_groups & eval_groups
        is_all_new_in_eval = all(split == "eval" for split in new.values())
        assert len(splits["eval"]) >= minimum or is_all_new_in_eval
        # the minimum takes no more groups than it needs: without its last one it falls short
        filled = sorted(
            (key for key, split in new.items() if split == "eval" and
             hashed_split(DOMAIN, key, fraction) == "train"),
            key=lambda key: position_of(DOMAIN, key),
        )  # fmt: skip
        if filled:
            assert len(splits["eval"]) - sizes[filled[-1]] < minimum
        ever_eval |= splits["eval"]
        ever_train_groups |= {group for group, _ in splits["train"]}
