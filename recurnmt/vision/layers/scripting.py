"""``torch.jit.script`` of an image model: its torch.fx graph, compiled.

TorchScript cannot compile the level stack itself (its hooks, depth plans and configs are
Python objects), but the model's fx graph compiles (timm's ``test_model_forward_fx_torchscript``
compiles the same graph for every model): the level loop is unrolled there, each level calls
the one block it runs, so a shared block's parameters stay one block's.
"""

from __future__ import annotations

import torch
from timm.layers._fx import get_notrace_functions, get_notrace_modules
from torch import nn


def inference_only(training: bool) -> None:
    """The first call of a scripted inference graph: a module switched to training refuses."""
    if training:
        raise RuntimeError(
            "this TorchScript module is the model's inference graph; call .eval() on it "
            "(train the Python model instead)"
        )


class ScriptsAsInferenceGraph:
    """Mixin: ``torch.jit.script(model)`` compiles the model's torch.fx graph.

    ``torch.jit`` calls ``__prepare_scriptable__`` on every module before it compiles it (the
    hook torch gives a module to name what to compile in its place), so the model, alone or
    inside a larger module, is scripted as that graph. The graph is traced with timm's leaf modules and wrapped
    functions (timm's ``test_model_forward_fx_torchscript`` compiles the same graph) and is
    the model's inference pass: what depends on ``training`` (dropout rates, stochastic depth,
    DVT's exits) is taken as in evaluation, so a model in training mode is refused, and the
    scripted module refuses to run once switched to training.
    """

    def __prepare_scriptable__(self) -> torch.fx.GraphModule:
        if self.training:
            raise RuntimeError(
                f"torch.jit.script({type(self).__name__}) compiles the model's inference "
                "graph: call model.eval() first"
            )
        return inference_graph(self)


def inference_graph(model: nn.Module) -> torch.fx.GraphModule:
    """``model``'s forward as a torch.fx ``GraphModule`` that TorchScript compiles (see
    :class:`ScriptsAsInferenceGraph`), guarded by :func:`inference_only`."""
    leaves = tuple(get_notrace_modules())

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, module, qualified_name):
            if leaves and isinstance(module, leaves):
                return True
            return super().is_leaf_module(module, qualified_name)

    tracer = Tracer(autowrap_functions=tuple(get_notrace_functions()), param_shapes_constant=True)
    graph = tracer.trace(model)
    for node in graph.nodes:
        if node.op == "output":
            node.type = None  # a union of output types (DVT) is no TorchScript type
    first = next(node for node in graph.nodes if node.op != "placeholder")
    with graph.inserting_before(first):
        graph.call_function(inference_only, (graph.get_attr("training"),))
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
