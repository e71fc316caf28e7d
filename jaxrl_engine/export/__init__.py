"""Exported policies: self-contained artefacts usable without the engine.

- `policy`: `export_policy` (JAX artefact: jax.export + params + loader), `export_torch`
  (torch module), `load_params`;
- `evaluate`: `evaluate_run`, what `jaxrl-engine eval` runs;
- `jax_loader.py`, `torch_loader.py`: the loaders copied into each policy directory (as
  `policy.py` and `torch_policy.py`), needing jax or torch only.
"""

from jaxrl_engine.export.policy import (
    POLICY_DIR,
    ExportError,
    export_policy,
    export_torch,
    load_params,
)

__all__ = ["POLICY_DIR", "ExportError", "export_policy", "export_torch", "load_params"]
