import pytest
import torch


@pytest.fixture
def one_thread():
    """Small networks on a shared machine: one torch thread is faster and does not contend. A file opts in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
