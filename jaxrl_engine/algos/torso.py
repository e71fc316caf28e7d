"""Which network reads the observations: `algo.torso` (auto | mlp | cnn) and `algo.cnn.*`.

`auto` puts a CNN in front of the MLP for image (rank-3) observations and uses the MLP alone
(on flattened observations) otherwise; `mlp` always flattens; `cnn` needs image observations.
The CNN's axis order is the env spec's `obs_layout` ("hwc" when the env does not declare it).
PPO (actor and critic) and DQN (the Q-network) take these keys; SAC and TD3 use MLPs.
Pure Python (no JAX): the config classes (`algos.configs`) check these keys, and the flax
networks (`algos.networks`) take the `ConvSpec` it gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, model_validator

from jaxrl_engine.io.schema import Strict

if TYPE_CHECKING:
    from jaxrl_engine.core.protocols import EnvSpec

Torso = Literal["auto", "mlp", "cnn"]
ConvImpl = Literal["auto", "matmul", "xla"]
TORSO_DESCRIPTION = (
    "network before the MLP: auto (a CNN for image (rank-3) observations, else none), "
    "mlp (flattened observations), cnn (algo.cnn.*; image observations only)"
)


@dataclass(frozen=True)
class ConvSpec:
    """The conv layers of a CNN torso: layer i has `channels[i]` filters of
    `kernels[i] x kernels[i]` at stride `strides[i]`, VALID padding; `layout` is the axis order
    of the observations ("hwc" or "chw"); `impl` how a layer is computed (`CNNConfig.impl`)."""

    channels: tuple[int, ...] = (16,)
    kernels: tuple[int, ...] = (3,)
    strides: tuple[int, ...] = (1,)
    layout: str = "hwc"
    impl: ConvImpl = "auto"


class CNNConfig(Strict):
    """The CNN torso's conv layers (VALID padding, algo.activation), then algo.hidden_sizes."""

    channels: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [16], description="filters of each conv layer"
    )
    kernels: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [3], description="kernel size (square) of each conv layer"
    )
    strides: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=lambda: [1], description="stride of each conv layer"
    )
    impl: ConvImpl = Field(
        "auto",
        description=(
            "how a conv layer is computed: matmul (the k*k shifted slices of the input, "
            "concatenated, times the kernel: one dot), xla (lax.conv_general_dilated), auto "
            "(matmul on CPU, xla on GPU/TPU); same parameters and math, equal to float rounding; "
            "XLA:CPU runs convolutions inside loops (the update's minibatch scan) about 10x "
            "slower than the equivalent dot"
        ),
    )

    @model_validator(mode="after")
    def _one_entry_per_layer(self) -> CNNConfig:
        lengths = {len(self.channels), len(self.kernels), len(self.strides)}
        if not self.channels or len(lengths) > 1:
            raise ValueError(
                f"algo.cnn.channels ({len(self.channels)} entries), algo.cnn.kernels "
                f"({len(self.kernels)}) and algo.cnn.strides ({len(self.strides)}) need one "
                "entry per conv layer, at least one layer"
            )
        return self


def conv_spec(torso: Torso, cnn: CNNConfig, spec: EnvSpec) -> ConvSpec | None:
    """The conv layers for `spec`'s observations (None: the MLP alone).

    ValueError naming `algo.torso` or `algo.cnn.*` when a CNN is asked for observations that
    are not images, or its layers do not fit the image.
    """
    shape = tuple(spec.obs_shape)
    if torso == "mlp" or (torso == "auto" and len(shape) != 3):
        return None
    if len(shape) != 3:
        raise ValueError(
            f"algo.torso=cnn needs image observations (rank 3, [H, W, C]); env {spec.env_id} "
            f"has observations of shape {list(shape)}: use algo.torso=mlp or auto"
        )
    layout = spec.obs_layout or "hwc"
    height, width = (shape[0], shape[1]) if layout == "hwc" else (shape[1], shape[2])
    for i, (kernel, stride) in enumerate(zip(cnn.kernels, cnn.strides, strict=True)):
        if kernel > min(height, width):
            raise ValueError(
                f"algo.cnn.kernels: conv layer {i}'s {kernel}x{kernel} kernel does not fit the "
                f"{height}x{width} feature map it gets from env {spec.env_id}'s observations "
                f"of shape {list(shape)} ({layout}); use fewer layers (algo.cnn.channels), "
                "smaller kernels or strides"
            )
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
    return ConvSpec(tuple(cnn.channels), tuple(cnn.kernels), tuple(cnn.strides), layout, cnn.impl)
