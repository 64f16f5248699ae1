import pytest

from sweep.core.space import (
    default_accum_values,
    default_split_values,
    enumerate_candidates,
    make_candidate,
)
from sweep.errors import SpaceError


@pytest.mark.parametrize(
    "accum, split, gbs, nd, per_device, joint, valid",
    [
        (1, 1, 1024, 8, 128, 128, True),
        (1, 8, 1024, 8, 128, 16, True),  # Myrtle's 8xA100 base answer
        (8, 4, 1024, 8, 16, 4, True),  # Myrtle's 8xA5000 large answer
        (3, 1, 1024, 8, 0, 0, False),  # 128/3 is not an integer
        (2, 3, 1024, 8, 64, 0, False),  # 64/3 is not an integer
        (256, 1, 1024, 8, 0, 0, False),  # 128/256 < 1
        (4, 4, 32, 1, 8, 2, True),
        (1, 64, 32, 1, 32, 0, False),  # split larger than the per-device batch
    ],
)
def test_make_candidate_applies_both_formulas(accum, split, gbs, nd, per_device, joint, valid):
    c = make_candidate(accum, split, gbs, nd)
    assert c.valid is valid
    assert c.joint_batch == joint
    if valid:
        assert c.per_device_batch * accum * nd == gbs
        assert c.per_device_batch == per_device and c.per_device_batch / split == joint
    else:
        assert "not an integer" in c.reason


@pytest.mark.parametrize(
    "gbs, nd, accums, splits",
    [
        (1024, 8, [1, 2, 4, 8, 16, 32, 64, 128], [1, 2, 4, 8, 16, 32, 64]),
        (32, 1, [1, 2, 4, 8, 16, 32], [1, 2, 4, 8, 16, 32]),
        (24, 1, [1, 2, 4, 8], [1, 2, 4, 8, 16]),
        (1024, 1, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], [1, 2, 4, 8, 16, 32, 64]),
    ],
)
def test_defaults_are_tunable_values(gbs, nd, accums, splits):
    assert default_accum_values(gbs, nd) == accums
    assert default_split_values(gbs, nd) == splits


def test_enumeration_lists_invalid_pairs_with_reasons_after_valid_ones():
    cands = enumerate_candidates(32, 1, [1, 2, 4, 8], [1, 2, 4, 8])
    valid = [c for c in cands if c.valid]
    invalid = [c for c in cands if not c.valid]
    assert [(c.accum, c.split) for c in invalid] == [(8, 8)]  # 4/8 is not an integer
    assert "joint_batch = 4/8 = 0.5" in invalid[0].reason
    assert len(valid) == 15 and cands[: len(valid)] == valid
    assert all(c.per_device_batch * c.accum == 32 for c in valid)


@pytest.mark.parametrize(
    "gbs, nd, accums, splits, message",
    [
        (0, 1, None, None, "global_batch_size=0 is not valid: expected a positive integer"),
        (-4, 1, None, None, "global_batch_size=-4 is not valid"),
        (32.5, 1, None, None, "global_batch_size=32.5 is not valid"),
        ("abc", 1, None, None, "global_batch_size='abc' is not valid"),
        (1000, 3, None, None, "global_batch_size=1000 is not divisible by num_devices=3"),
        (32, 0, None, None, "num_devices=0 is not valid"),
        (32, 1, [0], None, "accum=0 is not valid"),
        (32, 1, None, [-2], "split=-2 is not valid"),
        (32, 1, [1.5], None, "accum=1.5 is not valid"),
        (32, 1, [], None, "accum= is empty"),
        (32, 1, [3, 5], None, "no valid (accum, split) pair"),
    ],
)
def test_bad_settings_raise_one_line_naming_the_value(gbs, nd, accums, splits, message):
    with pytest.raises(SpaceError) as info:
        enumerate_candidates(gbs, nd, accums, splits)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "host, per_trial, groups",
    [
        (8, 8, [(0, 1, 2, 3, 4, 5, 6, 7)]),
        (8, 2, [(0, 1), (2, 3), (4, 5), (6, 7)]),
        (8, 3, [(0, 1, 2), (3, 4, 5)]),
        (8, 1, [(i,) for i in range(8)]),
        (2, 4, []),
    ],
)
def test_local_gpu_groups_are_disjoint(host, per_trial, groups):
    from sweep.launch.backend import gpu_groups

    assert gpu_groups(host, per_trial) == groups


def test_a_pairs_key_reads_back_and_other_names_are_refused() -> None:
    from sweep.core.space import make_candidate, pair_of_key

    assert pair_of_key(make_candidate(4, 16, 128, 1).key) == (4, 16)
    for name in ("accum4", "accum4_splitx", "split4_accum2", "provisional.json", "accum_split1"):
        with pytest.raises(ValueError, match="is not a pair's key"):
            pair_of_key(name)
