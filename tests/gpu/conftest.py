"""GPU tests: skipped, with the reason, where CUDA is not available. Run: `tools/test.sh tests/gpu`."""

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "tests/gpu/" in str(item.path):
            item.add_marker(skip)

