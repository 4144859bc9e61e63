import dataclasses

import pytest

from breakout_core.game.contract import CONTRACTS, Contract, contract_by_name


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.125
    return value + "-x"


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(Contract)])
def test_hash_changes_when_any_field_changes(field):
    base = Contract()
    changed = base.replace(**{field: _changed(getattr(base, field))})
    assert changed.hash != base.hash


def test_hash_is_stable_and_the_contract_frozen():
    assert Contract().hash == Contract().hash == CONTRACTS["breakout-v2"].hash
    assert len(Contract().hash) == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        Contract().frame_skip = 2  # type: ignore[misc]


def test_unknown_contract_names_the_known_ones():
    with pytest.raises(KeyError, match="breakout-v2"):
        contract_by_name("pong")


def test_breakout_v2_hash_is_the_one_stored_before_serving_existed():
    # checkpoints, fixed states and rows made before serve_after_life_loss existed carry this hash
    assert Contract().hash == "34831b6a492c742d"
    assert Contract().replace(serve_after_life_loss=True).hash != Contract().hash


def test_breakout_v3_is_v2_with_sticky_actions_and_no_noop_start():
    v3 = CONTRACTS["breakout-v3"]
    assert v3.hash == "d462bb08a939ded6"
    assert v3 == Contract().replace(name="breakout-v3", repeat_action_probability=0.25, noop_start_max=0)
