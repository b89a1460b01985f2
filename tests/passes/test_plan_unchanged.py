"""Every benchmark workload, the residual MLP and the GPT-like stack at a few sizes keep the
fusion plan recorded in plans_fixture.json: the same kernels, in the same order, fusing the
same ops.

These are change detectors, not an oracle: the fixture is the planner's own answer, written by
`python tests/passes/plan_oracle.py`, and a plan is right because a person reviewed it, not
because it matches. Whoever regenerates the fixture reviews the difference and says in the
commit message, for each plan that changed, why the new plan is better (fewer passes over
memory, fewer kernels, no value computed twice). The values of every plan are checked against
the reference interpreter elsewhere (test_workloads_preserved, test_workload_gradients).
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
