"""MRLA on ResNets (Fang et al., ICLR 2023): the paper's main setting, Table 1.

The backbone is timm's ResNet (torchvision's layout: 7 x 7 stem, max pooling, bottleneck stages
of 3-4-6-3 or 3-4-23-3 blocks, 25.56M / 44.55M parameters). An MRLA level runs after every
bottleneck (MRLA sec. 4, "a MRLA-base/light block can be inserted right after a building
layer"), on the block's output ``X^t`` (after its residual addition and ReLU):

* MRLA-light (eq. 8, Algorithm 3): ``O^t = lambda_o^t * O^{t-1} + sigmoid(Q^t_h . K^t_h /
  sqrt(d_k)) V^t_h``; MRLA-base (eq. 6, Algorithm 1): softmax attention over the keys and
  values of the stage's blocks so far;
* ``Q``, ``K``: global average pooling and a Conv1D of ECA's kernel size; ``V``: a 3 x 3
  depth-wise convolution without activation (Algorithms 1 and 3); heads of d_k = 32 channels
  (sec. 5.1, "d_k = 32 ... for ResNet");
* the recurrence restarts at every ResNet stage, whose first block changes the resolution and
  width (sec. 5.1: "the first layer [within each stage] only attends to itself").

The released code (``joyfang1106/MRLA``, ``resnet/models/``) builds the two variants apart, and
each registered model follows its own file by default:

* MRLA-light (``resnet_mrla_light.py``): heads of d_k = 32 channels (sec. 5.1's value), the
  branch ``BN(O^t)``;
* MRLA-base (``resnet_mrla_base.py``): heads of d_k = 16 channels (``dim_perhead = 16``) and a
  ReLU after the branch's batch norm, ``ReLU(BN(O^t))``. ``mrla_head_dim=32,
  mrla_branch_relu=False`` builds it as sec. 5.1 and the light code instead (recurnmt's
  MRLA-base before following the code). Neither changes a parameter count.

The released MRLA-base ResNet also has a deep stem (three 3 x 3 convolutions of 32, 32 and 64
channels, as timm's ``stem_type="deep", stem_width=32``; +19,232 parameters, +0.24 GMACs), which
the paper's Table 1 does not mention and the MRLA-light code does not have; timm's arguments
build it (``create_model("mrla_base_resnet50", stem_type="deep", stem_width=32)``).

The per-level MRLA modules are those of the vision transformers
(:class:`~recurnmt.vision.layers.layer_attention.LayerAttention`, one per stage), run on the
feature map seen as tokens (a view). Choices where the paper is silent, from the released code:

* ``O^t`` joins the feature map as a residual branch through a batch norm,
  ``X^t <- X^t + DropPath(BN(O^t))`` (the code's ``bn_mrla``); the recurrent state is ``O^t``
  before the norm. (The released code passes the block's input as ``O^{t-1}``; we pass the
  previous MRLA output, as eq. 8 and Algorithm 3 say.)
* Stochastic depth only on the MRLA branch, at rate 0.2 (App. B.1.1: "survival probability of
  0.8 only on our MRLA"), the same for every block.
* ``lambda_o`` starts at 1 (ablation (e), the identity connection); a stage's first block has
  none (nothing to retrieve), nor, in MRLA-base, a query.

Parameters (``tests/test_vision_params.py``): MRLA-light adds 0.178M to ResNet-50 (25.73M,
Table 1: 25.7M) and 0.387M to ResNet-101 (44.94M, Table 1: 44.9M); MRLA-base adds 0.166M to
ResNet-50 (25.72M, Table 1: 25.7M). Table 1 has no MRLA-base ResNet-101 (out of memory at the
paper's batch size); ``mrla_base_resnet101`` is built the same way. Multiply-accumulates at
224 x 224 (:func:`recurnmt.vision.training.flops.count_macs`, which counts convolutions and matrix
products only): ResNet-50 4.09G, + MRLA-light 4.14G (Table 1: 4.2B), + MRLA-base 4.15G
(Table 1: 4.6B; with the released code's deep stem, below, 4.39G); ResNet-101 + MRLA-light
7.88G (7.9B).

Shape legend: B batch, C channels, h x w feature map, N = h * w.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.models.resnet import Bottleneck, ResNet
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from recurnmt.vision.layers import to_2tuple
from recurnmt.vision.layers.layer_attention import LayerAttention, LayerState
from recurnmt.vision.layers.scripting import ScriptsAsInferenceGraph
from recurnmt.vision.registry import register_model

RESNET_DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}  # He et al. 2016, Table 1
# each variant's settings in the released code (resnet_mrla_light.py, resnet_mrla_base.py)
RELEASED = {
    "light": {"head_dim": 32, "branch_relu": False},
    "base": {"head_dim": 16, "branch_relu": True},
}


class MRLAStage(nn.Module):
    """One ResNet stage with an MRLA level after every block.

    The blocks keep their names (``0``, ``1``, ... as in the plain ResNet's ``nn.Sequential``),
    so a plain ResNet's state dict loads into the backbone (``strict=False``).

    Args:
        blocks: the stage's residual blocks, in order.
        dim: the blocks' output channels C.
        variant: ``light`` (eq. 8) or ``base`` (eq. 6).
        head_dim: channels per MRLA head d_k.
        drop_path: stochastic depth rate of every MRLA branch.
        branch_relu: a ReLU after the branch's batch norm (the released MRLA-base code).
    """

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        dim: int,
        variant: str,
        head_dim: int,
        drop_path: float,
        branch_relu: bool = False,
    ) -> None:
        super().__init__()
        self.num_blocks = len(blocks)
        for i, block in enumerate(blocks):
            self.add_module(str(i), block)
        self.mrla = LayerAttention(
            dim,
            self.num_blocks,
            variant=variant,
            head_dim=head_dim,
            stages=1,
            drop_path=drop_path,
            input_norm=False,
            value_act=False,
            branch_norm=True,
            branch_relu=branch_relu,
        )
        self.grad_checkpointing = False

    def step(self, i: int, x: Tensor, state: LayerState) -> tuple[Tensor, LayerState]:
        """Block ``i`` and its MRLA level: B x C_in x H x W -> B x C x h x w, new state."""
        x = getattr(self, str(i))(x)  # B x C x h x w
        b, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)  # B x N x C, a view of the map
        tokens, state = self.mrla.step(i, tokens, (h, w), state, num_prefix_tokens=0)
        return tokens.transpose(1, 2).reshape(b, c, h, w), state

    def forward(self, x: Tensor) -> Tensor:
        """B x C_in x H x W -> B x C x h x w."""
        state = None
        for i in range(self.num_blocks):
            if self.grad_checkpointing and torch.is_grad_enabled():
                # the block and its MRLA level recomputed in the backward pass; the state
                # crosses blocks as a checkpoint input and output
                x, state = checkpoint(self.step, i, x, state, use_reentrant=False)
            else:
                x, state = self.step(i, x, state)
        return x


class MRLAResNet(ScriptsAsInferenceGraph, ResNet):
    """timm's ResNet with MRLA after every bottleneck (MRLA Table 1).

    Everything timm's ResNet offers (``forward_features`` / ``forward_head``,
    ``reset_classifier``, ``set_grad_checkpointing``, ``forward_intermediates``) runs the
    MRLA stages, which replace ``layer1`` ... ``layer4``.

    Args:
        layers: bottleneck blocks per stage.
        mrla: ``light`` or ``base``.
        mrla_head_dim: channels per MRLA head d_k; must divide every stage's output width.
            None: the released code's, 32 for light (sec. 5.1's value for ResNets), 16 for base.
        mrla_branch_relu: a ReLU after the branch's batch norm. None: the released code's,
            on for base, off for light.
        mrla_drop_path: stochastic depth rate of the MRLA branches (0.2, App. B.1.1).
        img_size: the training resolution, kept for the data pipeline and evaluation (the
            network itself runs at any size).
        **kwargs: timm ``ResNet`` arguments (``num_classes``, ``in_chans``, ``channels``,
            ``stem_width``, ``drop_rate``, ``drop_path_rate``, ...).

    Raises:
        ValueError: an unknown ``mrla`` variant or a ``mrla_head_dim`` that does not divide a
            stage's width.
    """

    def __init__(
        self,
        layers: Sequence[int],
        *,
        mrla: str = "light",
        mrla_head_dim: int | None = None,
        mrla_branch_relu: bool | None = None,
        mrla_drop_path: float = 0.2,
        img_size: int | tuple[int, int] = 224,
        **kwargs,
    ) -> None:
        kwargs.setdefault("block", Bottleneck)
        super().__init__(layers=tuple(layers), **kwargs)
        self.in_chans = kwargs.get("in_chans", 3)  # older timm ResNets (1.0.20) do not keep it
        self.img_size = to_2tuple(img_size)
        self.mrla_variant = mrla
        released = RELEASED.get(mrla, {})  # an unknown variant is named by LayerAttention
        head_dim = released.get("head_dim", 32) if mrla_head_dim is None else mrla_head_dim
        relu = released.get("branch_relu", False) if mrla_branch_relu is None else mrla_branch_relu
        for name in ("layer1", "layer2", "layer3", "layer4"):
            blocks = list(getattr(self, name))
            dim = blocks[-1].bn3.num_features if hasattr(blocks[-1], "bn3") else None
            if dim is None:
                raise ValueError("MRLA on a ResNet needs bottleneck blocks (block=Bottleneck)")
            stage = MRLAStage(blocks, dim, mrla, head_dim, mrla_drop_path, relu)
            setattr(self, name, stage)

    classifier_names = "fc"  # timm's ResNet head

    @property
    def pool_size(self) -> tuple[int, int]:
        """The last stage's grid at the training resolution (timm's ``pool_size``: the
        stem and stages reduce 32 times)."""
        return tuple(-(-n // 32) for n in self.img_size)

    def set_img_size(self, img_size: int | tuple[int, int]) -> None:
        """A new training resolution (fine-tuning): nothing in a CNN depends on it."""
        self.img_size = to_2tuple(img_size)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Activation checkpointing per block (timm's API). timm's ResNet checkpoints the
        blocks of a stage as a plain sequence, which cannot carry MRLA's state from block to
        block, so each stage checkpoints its blocks itself and timm's flag stays off."""
        self.grad_checkpointing = False
        for name in ("layer1", "layer2", "layer3", "layer4"):
            getattr(self, name).grad_checkpointing = enable


def _mrla_resnet(depth: int, variant: str, **kwargs) -> MRLAResNet:
    """A registered configuration; every keyword (``layers`` and ``mrla`` too) overrides."""
    kwargs = {"layers": RESNET_DEPTHS[depth], "mrla": variant, **kwargs}
    return MRLAResNet(**kwargs)


@register_model
def mrla_light_resnet50(**kwargs) -> MRLAResNet:
    """ResNet-50 + MRLA-light (MRLA Table 1: 25.7M, 77.7 % top-1)."""
    return _mrla_resnet(50, "light", **kwargs)


@register_model
def mrla_base_resnet50(**kwargs) -> MRLAResNet:
    """ResNet-50 + MRLA-base (MRLA Table 1: 25.7M, 77.7 % top-1), as the released code: d_k =
    16 and a ReLU after the branch's batch norm (``mrla_head_dim=32, mrla_branch_relu=False``:
    sec. 5.1's d_k and the light variant's branch)."""
    return _mrla_resnet(50, "base", **kwargs)


@register_model
def mrla_light_resnet101(**kwargs) -> MRLAResNet:
    """ResNet-101 + MRLA-light (MRLA Table 1: 44.9M, 78.7 % top-1)."""
    return _mrla_resnet(101, "light", **kwargs)


@register_model
def mrla_base_resnet101(**kwargs) -> MRLAResNet:
    """ResNet-101 + MRLA-base (not in MRLA Table 1: out of memory at the paper's batch), built
    as ``mrla_base_resnet50``."""
    return _mrla_resnet(101, "base", **kwargs)
