"""The engine core: state, phases, hooks, engine, driver and `make_train`."""
