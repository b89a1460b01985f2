"""One local Ray instance (2 CPUs) for every data-parallel test of the session, shut down at
its end. Tests that need Ray are skipped, with the reason, only where the `distributed` extra
is not installed (`make test` installs it)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip(
        "ray", reason="the 'distributed' extra (Ray) is not installed: "
                      "pip install -e '.[distributed]'")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
