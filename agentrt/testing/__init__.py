"""Fixtures for tests and benches (a real redis-server started on loopback); not used by the library."""
