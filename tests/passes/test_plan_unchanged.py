"""Every benchmark workload, the residual MLP and the GPT-like stack at a few sizes keep the
fusion plan they had before fuse was made incremental: the same kernels, in the same order,
fusing the same ops.
"""

import json

import pytest

from plan_oracle import FIXTURE, current_plans

EXPECTED = json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def plans():
    return current_plans()


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_plan_is_unchanged(plans, key):
    assert len(plans[key]) == len(EXPECTED[key])
    assert plans[key] == EXPECTED[key]


def test_fixture_covers_every_plan(plans):
    assert sorted(plans) == sorted(EXPECTED)
