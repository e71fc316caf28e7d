"""Torch interoperability through DLPack: data, weights, policies, learners and simulators.

Importing `jaxrl_engine` never imports torch; these modules import it when first used
(`pip install 'jaxrl-engine[torch]'`).
"""

from jaxrl_engine.interop.dlpack import (
    BridgeError,
    BridgeReport,
    Transfer,
    check_donatable,
    from_torch,
    shares_memory,
    to_torch,
    to_torch_shards,
    torch_views,
)

__all__ = [
    "BridgeError",
    "BridgeReport",
    "Transfer",
    "check_donatable",
    "from_torch",
    "shares_memory",
    "to_torch",
    "to_torch_shards",
    "torch_views",
]
