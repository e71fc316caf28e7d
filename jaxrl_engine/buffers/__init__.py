"""Fixed-shape buffers living in `EngineState.buffer`."""

from jaxrl_engine.buffers.rollout import Transition

__all__ = ["Transition"]
