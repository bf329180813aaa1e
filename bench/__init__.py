"""The benchmark suite (bench/README.md). Not part of the tests."""
