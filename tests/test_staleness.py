"""The staleness admission rule, case by case (DESIGN §3; AReaL-lite StalenessManager.get_capacity)."""

import pytest

from areal_cli.rollout.staleness import StalenessManager


def admit_all(m: StalenessManager) -> int:
    n = 0
    while m.capacity() > 0:
        m.on_submit()
        n += 1
    return n


@pytest.mark.parametrize(
    "eta,batch,max_conc,version,running,accepted,expected",
    [
        (0, 4, 100, 0, 0, 0, 4),  # synchronous: one batch per version
        (0, 4, 100, 0, 4, 0, 0),  # ... all of it running
        (0, 4, 100, 0, 0, 4, 0),  # ... all of it accepted, waiting for the trainer
        (0, 4, 100, 1, 0, 4, 4),  # version bump opens exactly one more batch
        (2, 4, 100, 0, 0, 0, 12),  # eta=2: three batches ahead
        (2, 4, 8, 0, 0, 0, 8),  # concurrency cap binds
        (2, 4, 8, 0, 8, 0, 0),
        (1, 2, 100, 1, 1, 4, 1),  # (1+1+1)*2 - (4+1)
        (4, 8, 100, 3, 10, 50, 4 * 8 + 3 * 8 + 8 - 60),
        (0, 4, 100, 0, 0, 9, 0),  # never negative
    ],
)
def test_capacity_matches_areal_rule(eta, batch, max_conc, version, running, accepted, expected):
    m = StalenessManager(batch, eta, max_conc, version=version, running=running, accepted=accepted)
    assert m.capacity() == max(0, expected)


def test_eta0_is_synchronous_one_batch_per_version():
    m = StalenessManager(batch_size=3, max_head_offpolicyness=0, max_concurrent=64)
    for version in range(4):
        m.set_version(version)
        assert admit_all(m) == 3
        for _ in range(3):
            m.on_accept()
        assert m.capacity() == 0  # nothing more until the trainer publishes a new version


def test_eta_gt0_runs_ahead_by_eta_batches_then_waits_for_version_bump():
    m = StalenessManager(batch_size=2, max_head_offpolicyness=2, max_concurrent=64)
    assert admit_all(m) == 6
    for _ in range(6):
        m.on_accept()
    assert m.capacity() == 0
    m.set_version(1)  # trainer consumed one batch
    assert m.capacity() == 2


def test_rejected_group_frees_its_slot():
    m = StalenessManager(batch_size=4, max_head_offpolicyness=0, max_concurrent=64)
    admit_all(m)
    m.on_reject()
    assert m.capacity() == 1
    assert m.state_dict() == {"version": 0, "running": 3, "accepted": 0, "rejected": 1}


def test_admission_without_capacity_is_an_error():
    m = StalenessManager(batch_size=1, max_head_offpolicyness=0, max_concurrent=1)
    m.on_submit()
    with pytest.raises(RuntimeError):
        m.on_submit()


def test_invalid_settings_and_backward_version_are_rejected():
    with pytest.raises(ValueError):
        StalenessManager(0, 0, 1)
    with pytest.raises(ValueError):
        StalenessManager(1, -1, 1)
    m = StalenessManager(1, 0, 1, version=2)
    with pytest.raises(ValueError):
        m.set_version(1)
