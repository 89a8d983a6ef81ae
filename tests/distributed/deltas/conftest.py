"""Fixtures of the publish-folder tests: the real small tmpfs of the checkpoint tests (disk full)."""

from tests.reliability.test_checkpoint_integrity import small_fs  # noqa: F401  (a fixture, found by name)
