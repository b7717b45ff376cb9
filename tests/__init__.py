"""The test suite. Its shared helper modules (not test files) get pytest's assertion
rewriting as the test files do, so a failed ``assert`` in one says what it compared."""

import pytest

pytest.register_assert_rewrite("tests.crawling", "tests.helpers", "tests.netns_lab")
