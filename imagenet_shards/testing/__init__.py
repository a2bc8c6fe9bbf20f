"""Test and soak helpers that are real servers, not mocks: a SeaweedFS S3 server on loopback
(`s3_server`) and a fault-injecting HTTP proxy in front of it (`fault_proxy`). The tests, the
benchmarks and benchmarks/soak.py import them from here; nothing in the library does."""
