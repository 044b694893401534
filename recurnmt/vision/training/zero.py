"""Optimizer-state sharding (ZeRO stage 1) for ``python -m recurnmt.vision.training.train --zero``.

Under DDP every process holds the whole optimizer state: for AdamW two moments per
parameter, twice the model's size. ``--zero`` wraps timm's optimizer in torch's
:class:`~torch.distributed.optim.ZeroRedundancyOptimizer` (Rajbhandari et al. 2020, stage 1):
the parameters are split into one shard per process (whole tensors, largest first, to
balance the sizes), each process keeps the state of its shard only and updates only that
shard, then every shard is broadcast, so all replicas hold the same weights after each step.
Gradients are still all-reduced in full by DDP, so the losses are those of plain DDP.

The wrapper is built from the timm optimizer's parameter groups (weight decay off for
biases, norms and ``no_weight_decay()``, every group's settings kept) and its class; the
timm scheduler sets the learning rate on the wrapper's groups, which it copies to its local
optimizer at every step.

Checkpoints hold the full, unsharded state (:func:`full_optimizer_state` gathers the shards on
rank 0), in the format of the unwrapped optimizer: a run resumes from it with or without
``--zero`` and with any number of processes (each keeps the part of its own shard).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from timm.optim import Lamb, Lookahead
from torch.optim import Optimizer

with warnings.catch_warnings():
    # torch 2.5 announces, when torch.distributed.optim is imported, that its TorchScript
    # functional optimizers are deprecated; ZeroRedundancyOptimizer does not use them
    warnings.filterwarnings(
        "ignore", "`TorchScript` support for functional optimizers", DeprecationWarning
    )
    from torch.distributed.optim import ZeroRedundancyOptimizer

from recurnmt.modules import ConfigError
from recurnmt.vision.training.distributed import DistInfo


def shard_optimizer(optimizer: Optimizer, opt_name: str) -> ZeroRedundancyOptimizer:
    """``optimizer`` (a timm one, not yet stepped) sharded over the default process group.

    Args:
        optimizer: the optimizer to shard; its parameter groups (parameters and settings,
            e.g. per-group weight decay) and class define the sharded one. It must not have
            state yet: the returned optimizer replaces it.
        opt_name: its ``--opt`` name, for messages.

    Raises:
        ConfigError: an optimizer that does not work on a shard: timm's Lookahead, which wraps
            another optimizer, and LAMB, which clips by the gradient norm over all parameters
            (a shard would see only its own).
    """

    def refuse(reason: str) -> ConfigError:
        return ConfigError("--opt", opt_name, reason, related={"--zero": True})

    if isinstance(optimizer, Lookahead):
        raise refuse("timm's Lookahead wraps another optimizer, which {--zero} cannot shard")
    if isinstance(optimizer, Lamb) and optimizer.defaults.get("max_grad_norm"):
        raise refuse(
            "LAMB clips by the gradient norm over all parameters, which a shard of {--zero} "
            "does not see; use another optimizer, with --clip-grad for clipping"
        )
    if optimizer.state:
        raise ValueError("shard_optimizer needs an optimizer that has not stepped yet")
    cls = type(optimizer)
    # the class's own defaults (LAMB, for one, reads self.defaults); keys its constructor
    # does not take (AdamW's decoupled_weight_decay) come with every group instead
    accepted = inspect.signature(cls).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    groups = [dict(group) for group in optimizer.param_groups]  # every setting, per group
    return ZeroRedundancyOptimizer(groups, optimizer_class=cls, **defaults)


def shard_sizes(optimizer: ZeroRedundancyOptimizer) -> tuple[int, int]:
    """(parameters whose state this process keeps, all parameters), in elements."""
    local = sum(p.numel() for group in optimizer.optim.param_groups for p in group["params"])
    total = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    return local, total


def full_optimizer_state(optimizer: Optimizer, info: DistInfo) -> dict[str, Any] | None:
    """The whole optimizer state on rank 0 (``None`` on the others), as ``state_dict()``.

    Every rank must call it: with ``--zero`` the shards are gathered on rank 0 by collective
    operations (``consolidate_state_dict``) before rank 0 reads the state.
    """
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        if info.is_main and info.device.type != "cpu":
            # the shards are copied to the CPU without blocking; wait before reading them
            synchronize(info.device)
    return optimizer.state_dict() if info.is_main else None


def load_optimizer_state(optimizer: Optimizer, state: dict[str, Any], source: str) -> None:
    """Loads a full state (of either kind of run) into ``optimizer``, sharded or not.

    A sharded optimizer keeps the part of its own shard; any number of processes works.

    Raises:
        ConfigError: the checkpoint's parameter groups differ from this run's (another model,
            or an optimizer with another grouping), which no optimizer can load.
    """
    saved = [len(group["params"]) for group in state["param_groups"]]
    current = [len(group["params"]) for group in optimizer.param_groups]
    if saved != current:
        raise ConfigError(
            "--resume",
            source,
            f"its optimizer has parameter groups of {saved} parameters, this run's "
            f"{current}; resume with the model and --opt of the run that wrote it",
        )
    optimizer.load_state_dict(state)
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        # ZeroRedundancyOptimizer.load_state_dict gives its local optimizer the shard's state
        # and keeps another copy in the wrapper's own `state`, which nothing reads (state_dict
        # takes the local optimizers' states); a run that never resumed has none there, and
        # on a GPU the copy would double the shard's memory
        optimizer.state.clear()


def synchronize(device: torch.device) -> None:
    """Waits for ``device``'s queued work (``torch.accelerator`` arrived in torch 2.6; before
    it, the accelerator torch offered was CUDA)."""
    accelerator = getattr(torch, "accelerator", None)
    (accelerator or torch.cuda).synchronize(device)
