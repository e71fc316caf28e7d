"""Meshes and state placement: one code path from one CPU to many devices."""

from jaxrl_engine.distributed.mesh import data_mesh, state_sharding

__all__ = ["data_mesh", "state_sharding"]
