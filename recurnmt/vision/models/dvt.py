"""Dynamic Vision Transformer: a cascade of ViTs over growing token grids (Wang et al. 2021).

DVT ("Not All Images are Worth 16x16 Words", NeurIPS 2021) runs K transformers on the same
image cut into more and more tokens (7x7 -> 10x10 -> 14x14 at 224 in the paper) and stops at
the first exit whose softmax confidence reaches that exit's threshold (sec. 3.3). All exits
are trained together, the loss summed over them (eq. 1). Two mechanisms let a downstream
model reuse its upstream model's computation (sec. 3.2):

* feature reuse (eq. 4-5): the upstream model's final tokens go through a per-layer LN-MLP
  ``f_l`` (D -> 128 -> 48), are upsampled to the downstream grid, and enter every downstream
  FFN as extra input columns: ``z_l = MLP(LN(Concat(z'_l, E_l))) + z'_l``;
* relationship reuse (eq. 8-9): the attention logits of every upstream level, concatenated
  over heads and levels, go through one MLP (``N^H L -> 3 N^H L -> N^H L``, shared hidden
  layer, sec. 4 "Implementation details"), are upsampled row- and column-wise (Fig. 5) and
  added to the downstream logits of each level: ``Softmax(A_l + r_l(A^up)) V_l``.

The reuse modules are in :mod:`recurnmt.vision.layers.reuse`. The backbones are this package's :class:`~recurnmt.vision.models.vit.VisionTransformer`, so a
cascade can be built from DeiT or from the weight-shared models (RingFormer-ViT, UiT,
recursive DeiT): ``create_model("dvt_deit_small_patch16_224", backbone="uit_small_patch16_224")``.

Choices where the paper is silent or where we depart from the authors' code (read, not
copied):

* Token grids: every backbone keeps its patch size and sees the image resized (bilinear,
  antialiased) to ``grid * patch``; the authors' DeiT cascade changes the patch size instead
  (32/23 with padding/16). Both give the paper's grids; resizing works for any grid.
* Feature reuse is eq. 5 exactly, without touching the backbone's block: the LN over
  ``Concat(z'_l, E_l)`` takes its first D scales from the block's own FFN norm and D' more
  from a context LN; the first FFN layer's D' extra columns add their product to the hidden
  pre-activation. Both belong to the block, so a recurrent backbone shares them as it shares
  the block (per level where it has per-level norms, one set for a One Wide FFN); ``f_l`` is
  per level (eq. 4). The class token's context is zero (paper). The last model of a cascade
  that classifies from its class token has no ``f_L`` for its last level: those patch tokens
  are never read, so ``f_L`` could change nothing (its context is zero instead).
* ``f_l`` reads the upstream tokens after the final LN (the authors' code takes them before;
  ``f_l`` starts with its own LN either way).
* Upsampling is bilinear (``upsample_mode``); the authors use nearest upsampling to about 2x
  followed by adaptive average pooling. The class-token row and column of the reused logits
  are carried over as they are (authors' code).
* The reused logits of an upstream model that itself reuses relations include its added
  term (authors' code). A model reuses only its immediate upstream model.
* Relationship reuse keeps SDPA: the reused logits are its additive float mask. Only stages
  with a downstream model that reuses relations compute their logits explicitly.

Shape legend: B batch, K exits, T = 1 + N tokens with an N = h x w grid, D width, H heads,
L levels, D' context width, F FFN width, C classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from recurnmt.modules.tracing import traceable
from recurnmt.vision.layers import to_2tuple
from recurnmt.vision.layers.reuse import FeatureReuse, Grid, RelationReuse, ReuseHook
from recurnmt.vision.layers.scripting import ScriptsAsInferenceGraph
from recurnmt.vision.models.vit import VisionTransformer
from recurnmt.vision.registry import create_model, register_model


@dataclass
class Upstream:
    """What a stage hands to the next one: its final tokens and its attention logits."""

    tokens: Tensor | None  # B x T x D
    logits: Tensor | None  # B x HL x T x T
    grid: Grid

    def select(self, index: Tensor) -> Upstream:
        """The state of the samples at ``index`` (early exit keeps only the active ones)."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return Upstream(pick(self.tokens), pick(self.logits), self.grid)


@traceable
class DVTCascade(ScriptsAsInferenceGraph, nn.Module):
    """K vision transformers on increasing token grids with early exits (DVT sec. 3).

    ``forward`` returns the last exit's logits (the full cascade), and in training every
    exit's, as :meth:`forward_exits` (eq. 1); :meth:`early_exit` runs the cascade adaptively
    (sec. 3.3).

    Args:
        stages: the K backbones, from the coarsest grid to the finest; each classifies.
        grids: the token grid (rows, cols) of each stage; stage k sees the image resized to
            ``grid * patch_size``.
        feature_reuse: add :class:`FeatureReuse` to every stage after the first.
        relation_reuse: add :class:`RelationReuse` to every stage after the first.
        context_dim: D' of feature reuse (48 in the paper).
        context_hidden_dim: hidden width of ``f_l`` (128 in the paper).
        relation_hidden_ratio: hidden width of ``r`` in units of H L (3 in the paper).
        upsample_mode: ``F.interpolate`` mode of both reuse mechanisms.
        img_size: the nominal input resolution (what data pipelines should produce).

    Raises:
        ValueError: fewer than two stages, grids that do not grow, a stage that is not a
            class-token ViT, or feature reuse on a backbone without FFN.
    """

    # refused by recurnmt.modules.shallow_branch (SReT's mixed depth)
    no_shallow_branch = (
        "the shallow branch (SReT mixed depth) is not supported by DVT cascades, which train "
        "every exit instead (DVT eq. 1)"
    )
    # forward_features gives the last stage's tokens B x T x D, not a map (timm's Format)
    output_fmt = "NLC"

    def __init__(
        self,
        stages: Sequence[VisionTransformer],
        grids: Sequence[int | Grid],
        *,
        feature_reuse: bool = True,
        relation_reuse: bool = True,
        context_dim: int = 48,
        context_hidden_dim: int = 128,
        relation_hidden_ratio: int = 3,
        upsample_mode: str = "bilinear",
        img_size: int | Grid = 224,
    ) -> None:
        super().__init__()
        grids = tuple(to_2tuple(g) for g in grids)
        check_grids(grids)
        if len(stages) != len(grids):
            raise ValueError(f"grids={grids} gives {len(grids)} grids for {len(stages)} stages")
        for k, s in enumerate(stages):
            if not isinstance(s, VisionTransformer):
                raise ValueError(f"stage {k} is a {type(s).__name__}; DVT needs ViT backbones")
        classes = {s.num_classes for s in stages}
        if len(classes) != 1:
            raise ValueError(f"the stages have different numbers of classes: {sorted(classes)}")
        self.stages = nn.ModuleList(stages)
        self.grids = grids
        self.upsample_mode = upsample_mode
        self.img_size = to_2tuple(img_size)
        self.num_classes = stages[-1].num_classes
        self.num_features = self.embed_dim = stages[-1].num_features
        self.head_hidden_size = stages[-1].head_hidden_size
        # timm's names for the parts: every exit's head; the features are the last stage's
        self.classifier_names = tuple(f"stages.{k}.head" for k in range(len(stages)))
        self.pool_size = grids[-1]
        self.feature_info = [
            {**info, "module": f"stages.{len(stages) - 1}.{info['module']}"}
            for info in stages[-1].feature_info
        ]
        self.in_chans = stages[-1].in_chans
        self.feature_reuse = nn.ModuleList()
        self.relation_reuse = nn.ModuleList()
        for up, down in zip(stages[:-1], stages[1:], strict=True):
            shape = _stack_shape(down)
            last = down is stages[-1]
            if feature_reuse:
                if shape["ffn_dim"] is None:
                    raise ValueError("feature_reuse=True needs backbones with an FFN")
                self.feature_reuse.append(
                    FeatureReuse(
                        up.num_features,
                        down.num_features,
                        shape["ffn_dim"],
                        down.stack.plan.block_of_level,
                        norms_per_level=shape["norms_per_level"],
                        shared_ffn=shape["shared_ffn"],
                        hidden_dim=context_hidden_dim,
                        context_dim=context_dim,
                        norm_eps=shape["norm_eps"],
                        skip_last_level=last and down.global_pool == "token",
                    )
                )
            else:
                self.feature_reuse.append(nn.Identity())
            if relation_reuse:
                up_maps = _stack_shape(up)["num_heads"] * up.stack.num_levels
                self.relation_reuse.append(
                    RelationReuse(
                        up_maps, shape["num_heads"], down.stack.num_levels, relation_hidden_ratio
                    )
                )
            else:
                self.relation_reuse.append(nn.Identity())

    @property
    def num_exits(self) -> int:
        return len(self.stages)

    def training_wrapper(self, mixed_depth: bool = False) -> nn.Module:
        """What the training command trains: the cascade itself, whose training-mode forward
        gives every exit's logits, the losses summed (DVT eq. 1).

        Raises:
            ValueError: ``mixed_depth`` (SReT's shallow branch has no place in a cascade).
        """
        if mixed_depth:
            raise ValueError(
                "--mixed-depth (SReT's shallow branch) does not apply to DVT cascades, "
                "which train every exit instead"
            )
        return self

    def no_weight_decay(self) -> set[str]:
        """The backbones' exemptions, prefixed with their stage."""
        return {
            f"stages.{k}.{name}" for k, s in enumerate(self.stages) for name in s.no_weight_decay()
        }

    def set_grad_checkpointing(self, enable: bool = True, segment: int | str = 0) -> None:
        """Activation checkpointing per level of every stage (timm's API), or per ``segment``
        of levels (:meth:`~recurnmt.modules.RecurrentStack.set_grad_checkpointing`)."""
        for stage in self.stages:
            stage.set_grad_checkpointing(enable, segment=segment)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Fresh heads of ``num_classes`` outputs at every exit (and their pooling where
        ``global_pool`` is given, timm's API)."""
        for s in self.stages:
            s.reset_classifier(num_classes, global_pool)
        self.num_classes = num_classes

    def set_img_size(self, img_size: int | Grid) -> None:
        """A new nominal input size; the stages keep their token grids."""
        self.img_size = to_2tuple(img_size)

    def stage_input(self, k: int, images: Tensor) -> Tensor:
        """Images B x C x H x W resized to stage k's ``grid * patch`` (no-op when equal)."""
        p = self.stages[k].patch_embed.patch_size
        return resized(images, (self.grids[k][0] * p[0], self.grids[k][1] * p[1]))

    def _reuse_hook(
        self, k: int, up: Upstream | None, capture: list[Tensor] | None
    ) -> list[ReuseHook]:
        """Stage k's level hooks: reuse terms from ``up``, logit capture into ``capture``."""
        fr = self.feature_reuse[k - 1] if k > 0 and up is not None else None
        rr = self.relation_reuse[k - 1] if k > 0 and up is not None else None
        fr = fr if isinstance(fr, FeatureReuse) else None
        rr = rr if isinstance(rr, RelationReuse) else None
        if fr is None and rr is None and capture is None:
            return []
        prefix = self.stages[k].num_prefix_tokens
        grids = (up.grid, self.grids[k]) if up is not None else None
        mode = self.upsample_mode
        features = (fr, fr.contexts(up.tokens, *grids, prefix, mode)) if fr else None
        relations = (rr, rr.hidden(up.logits)) if rr else None
        return [
            ReuseHook(
                prefix,
                features=features,
                relations=relations,
                grids=grids,
                mode=mode,
                capture=capture,
            )
        ]

    def run_stage(
        self, k: int, images: Tensor, up: Upstream | None, keep: bool
    ) -> tuple[Tensor, Upstream | None]:
        """Stage k on ``images`` with reuse from ``up``; returns its logits (B x C) and,
        when ``keep``, what the next stage reuses."""
        stage = self.stages[k]
        needs_logits = keep and isinstance(self.relation_reuse[k], RelationReuse)
        needs_tokens = keep and isinstance(self.feature_reuse[k], FeatureReuse)
        logits: list[Tensor] | None = [] if needs_logits else None
        hooks = self._reuse_hook(k, up, logits)
        tokens = stage.forward_features(self.stage_input(k, images), hooks=hooks)  # B x T x D
        out = stage.forward_head(tokens)
        if not keep:
            return out, None
        maps = torch.cat(logits, dim=1) if needs_logits else None  # B x HL x T x T
        return out, Upstream(tokens if needs_tokens else None, maps, self.grids[k])

    def forward_exits(self, x: Tensor, num_exits: int | None = None) -> list[Tensor]:
        """Logits of the first ``num_exits`` exits (all by default), each B x C (eq. 1)."""
        n = self.num_exits if num_exits is None else num_exits
        if not 1 <= n <= self.num_exits:
            raise ValueError(f"num_exits={n}; the cascade has {self.num_exits} exits")
        outs, up = [], None
        for k in range(n):
            out, up = self.run_stage(k, x, up, keep=k + 1 < n)
            outs.append(out)
        return outs

    def _last_stage_input(self, x: Tensor) -> tuple[Tensor, list[ReuseHook]]:
        """The whole cascade but its last stage: that stage's images and reuse hooks."""
        up = None
        for k in range(self.num_exits - 1):
            _, up = self.run_stage(k, x, up, keep=True)
        k = self.num_exits - 1
        return self.stage_input(k, x), self._reuse_hook(k, up, None)

    def forward_features(self, x: Tensor) -> Tensor:
        """Final tokens of the last stage, B x T x D, after running the whole cascade."""
        images, hooks = self._last_stage_input(x)
        return self.stages[-1].forward_features(images, hooks=hooks)

    def forward_intermediates(
        self, x: Tensor, indices: int | Sequence[int] | None = None, **kwargs
    ) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        """The last stage's level outputs (timm's API, as
        :meth:`VisionTransformer.forward_intermediates`), after the stages before it."""
        images, hooks = self._last_stage_input(x)
        return self.stages[-1].forward_intermediates(images, indices, hooks=hooks, **kwargs)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """The last stage's (timm's API); the earlier exits' heads stay (the last stage
        reuses what the earlier stages compute)."""
        take = self.stages[-1].prune_intermediate_layers(indices, prune_norm, prune_head)
        if prune_head:
            self.num_classes = 0
        return take

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """The last exit's head on its tokens."""
        return self.stages[-1].forward_head(x, pre_logits)

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, ...]:
        """The last exit's logits B x C (the full cascade); in training every exit's, a tuple
        whose losses are summed (DVT eq. 1), so every head is trained (as timm's distilled
        models return both heads' logits in training)."""
        exits = self.forward_exits(x)
        return tuple(exits) if self.training else exits[-1]

    @torch.no_grad()
    def early_exit(self, x: Tensor, thresholds: Sequence[float] | Tensor) -> tuple[Tensor, Tensor]:
        """Confidence-based adaptive inference (DVT sec. 3.3).

        A sample leaves at the first exit k < K whose largest softmax probability reaches
        ``thresholds[k]``; the last exit takes the rest (its threshold is 0). Each stage runs
        only on the samples still active.

        Args:
            x: images B x C x H x W.
            thresholds: K - 1 confidences eta_1 .. eta_{K-1}.

        Returns:
            Logits B x C (of each sample's exit) and the exit index of each sample (B,).
        """
        thresholds = check_thresholds(thresholds, self.num_exits)
        b = x.size(0)
        logits: Tensor | None = None
        exit_at = torch.full((b,), self.num_exits - 1, dtype=torch.long, device=x.device)
        active = torch.arange(b, device=x.device)
        up = None
        for k in range(self.num_exits):
            last = k == self.num_exits - 1
            out, up = self.run_stage(k, x[active], up, keep=not last)
            if logits is None:
                logits = out.new_zeros(b, out.size(1))
            if last:
                logits[active] = out
                break
            done = out.float().softmax(-1).amax(-1) >= thresholds[k]  # B_active
            logits[active[done]] = out[done]
            exit_at[active[done]] = k
            stay = (~done).nonzero().squeeze(1)
            active, up = active[stay], up.select(stay)
            if active.numel() == 0:
                break
        return logits, exit_at


def resized(images: Tensor, size: tuple[int, int]) -> Tensor:
    """Images B x C x H x W at ``size`` (antialiased bilinear; themselves when equal)."""
    if images.shape[-2] == size[0] and images.shape[-1] == size[1]:
        return images
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=True)


torch.fx.wrap("resized")  # a call in torch.fx's graph: its size test runs with it


def _stack_shape(model: VisionTransformer) -> dict:
    """What the reuse modules need to know of a backbone's stack, read off its modules."""
    stack = model.stack
    blocks = list(stack.blocks)
    ffn = blocks[0].ffn
    norms = stack.levels[0].norms if stack.levels[0].norms is not None else blocks[0].norms
    return {
        "ffn_dim": None if ffn is None else ffn.up.out_features,
        "norms_per_level": stack.levels[0].norms is not None,
        "shared_ffn": len(blocks) > 1 and all(b.ffn is ffn for b in blocks),
        "norm_eps": norms[0].eps,
        "num_heads": blocks[0].self_attn.num_heads,
    }


def check_grids(grids: Sequence[Grid]) -> None:
    """Raises ValueError unless there are >= 2 grids growing in tokens, never shrinking."""
    if len(grids) < 2:
        raise ValueError(f"grids={tuple(grids)}: a cascade needs at least two token grids")
    for a, b in zip(grids[:-1], grids[1:], strict=True):
        if b[0] < a[0] or b[1] < a[1] or b[0] * b[1] <= a[0] * a[1]:
            raise ValueError(
                f"grids={tuple(grids)} must grow from stage to stage ({a} -> {b} does not)"
            )


def check_thresholds(thresholds: Sequence[float] | Tensor, num_exits: int) -> Tensor:
    """Thresholds as a float tensor of K - 1 values, or ValueError naming the count."""
    t = torch.as_tensor(thresholds, dtype=torch.float32).flatten()
    if t.numel() != num_exits - 1:
        raise ValueError(
            f"thresholds: {t.numel()} given, a cascade of {num_exits} exits needs "
            f"{num_exits - 1} (the last exit takes every remaining sample)"
        )
    return t


_CASCADE_KEYS = (
    "feature_reuse",
    "relation_reuse",
    "context_dim",
    "context_hidden_dim",
    "relation_hidden_ratio",
    "upsample_mode",
)


def _create_dvt(defaults: dict, kwargs: dict) -> DVTCascade:
    """Builds a cascade of ``backbone`` models; keys not of the cascade go to every backbone.

    ``img_size`` is the cascade's nominal input size; each backbone is built at its own
    ``grid * patch_size``.
    """
    args = {**defaults, **kwargs}
    backbone = args.pop("backbone")
    grids = tuple(to_2tuple(g) for g in args.pop("grids"))
    check_grids(grids)
    img_size = args.pop("img_size", 224)
    cascade = {k: args.pop(k) for k in _CASCADE_KEYS if k in args}
    try:
        with torch.device("meta"):  # shapes only: read the backbone's patch size
            probe = create_model(backbone, **args)
    except KeyError as err:
        raise ValueError(f"backbone={backbone!r} is not a registered vision model") from err
    except TypeError as err:
        if "backbone" not in kwargs:  # the entry point's own ViT: a keyword no model takes
            raise
        # another family's builder refusing the ViT settings
        raise ValueError(
            f"backbone={backbone!r} cannot be built with {sorted(args)} ({err}); DVT needs a "
            "VisionTransformer family model (DeiT, recursive DeiT, RingFormer-ViT, UiT, OWF)"
        ) from err
    if not isinstance(probe, VisionTransformer):
        raise ValueError(
            f"backbone={backbone!r} builds a {type(probe).__name__}; DVT needs a "
            "VisionTransformer family model (DeiT, recursive DeiT, RingFormer-ViT, UiT, OWF)"
        )
    if probe.num_prefix_tokens != 1:
        raise ValueError(f"backbone={backbone!r} has no class token; DVT needs one")
    p = probe.patch_embed.patch_size
    stages = [
        create_model(backbone, **{**args, "img_size": (g[0] * p[0], g[1] * p[1])}) for g in grids
    ]
    return DVTCascade(stages, grids, img_size=img_size, **cascade)


# ---------------------------------------------------------------- entry points


@register_model(fixed_input_size=True)  # resized to the stages' grids
def dvt_deit_small_patch16_224(**kwargs) -> DVTCascade:
    """DVT on DeiT-S (DVT sec. 4, Table 4, Fig. 7): 7x7 -> 10x10 -> 14x14 tokens.

    Three DeiT-S (22.05M at 14x14; the coarser stages have smaller position tables) plus
    feature reuse (2 x 12 x (f_l + LN + 48 x 1536 columns) = 3.12M, less the last model's
    f_12, 0.06M, whose context no output reads) and relationship reuse (2 x MLP
    72 -> 216 -> 72 = 0.06M): 69.19M, 66.06M without reuse. ``backbone=`` swaps
    the backbone, e.g. ``"deit_tiny_recursive_patch16_224"`` or ``"uit_small_patch16_224"``.
    """
    return _create_dvt(
        dict(backbone="deit_small_patch16_224", grids=((7, 7), (10, 10), (14, 14))), kwargs
    )


@register_model(fixed_input_size=True)  # resized to the stages' grids
def dvt_ringformer_vit_small_patch16_224(**kwargs) -> DVTCascade:
    """DVT on RingFormer-ViT (RingFormer Table 2: one 512/2048 block over 6 levels, 8 heads).

    Three weight-shared backbones on 7x7 / 10x10 / 14x14 tokens; the context columns of
    feature reuse are shared as the block is, ``f_l`` and the context LNs are per level.
    """
    return _create_dvt(
        dict(backbone="ringformer_vit_small_patch16_224", grids=((7, 7), (10, 10), (14, 14))),
        kwargs,
    )


@register_model(img_size=16, fixed_input_size=True)
def dvt_vit_mini_patch2(**kwargs) -> DVTCascade:
    """A CPU-sized DVT on the 64-wide mini ViT (depth 4): 4x4 -> 6x6 -> 8x8 tokens of 2 x 2
    patches, i.e. 16 x 16 digits seen at 8, 12 and 16 pixels."""
    return _create_dvt(
        dict(
            backbone="vit_mini_patch4",
            patch_size=2,
            depth=4,
            grids=((4, 4), (6, 6), (8, 8)),
            img_size=16,
        ),
        kwargs,
    )


@register_model(img_size=16, fixed_input_size=True)
def dvt_ringformer_vit_mini_patch2(**kwargs) -> DVTCascade:
    """A CPU-sized DVT on the mini RingFormer-ViT (one 64-wide block, 6 levels):
    4x4 -> 6x6 -> 8x8 tokens of 2 x 2 patches (16 x 16 digits at 8, 12, 16 pixels)."""
    return _create_dvt(
        dict(
            backbone="ringformer_vit_mini_patch4",
            patch_size=2,
            grids=((4, 4), (6, 6), (8, 8)),
            img_size=16,
        ),
        kwargs,
    )
