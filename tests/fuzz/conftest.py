"""Every fuzz test's draws depend on its seed alone (fixed_constant_pool: hypothesis would otherwise draw from
literals in whichever kiln modules other tests had imported), so a run of `make test` checks the same programs every
time."""

import pytest

from tests.fuzz.programs import fixed_constant_pool


@pytest.fixture(autouse=True)
def _draws_from_the_seed_alone():
    with fixed_constant_pool():
        yield
