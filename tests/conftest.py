import os

import pytest
import torch

# Under pytest-xdist (`make test` runs one worker per core) every worker keeps to one torch thread: two workers of
# two threads each on a 2-core machine only contend. A test that needs more threads sets them itself.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """Small networks on a shared machine: one torch thread is faster and does not contend. A file opts in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
