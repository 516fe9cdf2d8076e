"""The test suite, a package: pytest puts the repository root on sys.path (not tests/,
whose recipes/ and autotune/ folders would otherwise stand in for the packages they
test), and the shared pieces import as `tests.helpers`, `tests.conftest`."""
