"""Test and soak rigs that are real servers, not mocks: a SeaweedFS S3 server on loopback (`s3_server`), a
fault-injecting HTTP proxy in front of it (`fault_proxy`), and the soak's schedule, job, run and checker
(`soak_*`). They live beside the library, not in it (issue 46): the wheel installs `imagenet_shards` only
(pyproject.toml's packages.find), and the tests, the benchmarks and benchmarks/soak.py import them from the
checkout (its root on sys.path, as `python -m pytest` and the benchmarks' own sys.path line put it)."""
