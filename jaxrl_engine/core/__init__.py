"""The engine core, written against the `Env` and `Algorithm` protocols only: state, phases,
hooks (traced ones, offload, nan_guard, timing), warm-up, sharding, the engine and
`make_train`. No config, files, export, torch or driver (see tests/test_architecture.py)."""
