"""No tensor derived from the weights outlives them: a randomized test for every family.

Decoding runs some levels' linears with weights derived from the parameters (RingFormer's
signals and a relaxed level's LoRA folded into the projections, ACT's halting unit cast to
float32). Each case of this test changes the weights through one of the ways people change them
(an in-place write through ``.data``, fairseq's Adam, torch's fused Adam / AdamW / SGD,
``vector_to_parameters``, ``load_state_dict``, an EMA written through ``.data``, an fp16
optimizer's ``p.data.copy_``, dtype moves) and then runs the model one way (an evaluation pass,
incremental decoding with a beam-search reorder, under ``torch.inference_mode`` (and a model
built under it, whose parameters are inference tensors), with forward
hooks on the shared projections, through ``torch.compile``, after dynamic int8 quantisation, in
half precision), and compares its output with a cache-free reference: a separate instance of the
same architecture loaded with the same weights and run in training mode with gradients on
(dropout is 0), where no derived tensor is ever kept.

The cases are drawn from a seeded generator, :data:`CASES` per family, and every failing case is
reported (case, weight change, check, difference) rather than only the first.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from fairseq.optim.adam import Adam as FairseqAdam
from torch import nn
from torch.ao.quantization import quantize_dynamic
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from recurnmt.modules.compile import CompileSettings
from recurnmt.nmt.architectures import FAMILIES
from tests.nmt_helpers import batch, build, train_signals

CASES = 200
# cases that compile the stacks (each compiles an encoder and a decoder pass: seconds apiece)
COMPILE_AT = (0, CASES // 2)
# float64: ACT's halting is float32 in every dtype (recurnmt.modules.halting), 1e-7 apart
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-6, torch.float16: 3e-2}
CHANGES = (
    "none",
    "data_add",
    "data_copy",
    "no_grad_add",
    "fairseq_adam",
    "adam_fused",
    "adamw_fused",
    "sgd_fused",
    "vector_to_parameters",
    "load_state_dict",
    "ema",
    "to_float64",
    "to_float32",
)
CHECKS = (
    "eval",
    "inference_mode",
    "built_in_inference_mode",
    "incremental",
    "hooks",
    "quantized",
    "half",
)
HALF_CHANGES = ("none", "data_add", "data_copy", "no_grad_add", "ema")


@dataclass
class Failure:
    case: int
    change: str
    check: str
    what: str


@dataclass
class Harness:
    """One family's model under test, its reference instance and a batch."""

    family: str
    rng: random.Random
    model: nn.Module = field(init=False)
    reference: nn.Module = field(init=False)

    def __post_init__(self) -> None:
        arch = f"{self.family}_tiny"
        torch.manual_seed(self.rng.randrange(2**31))  # the initial weights, as the cases
        self.model = build(arch)[0]
        train_signals(self.model)
        with torch.no_grad():  # a relaxed level's LoRA of std 0.2 on both factors makes
            for name, p in self.model.named_parameters():  # float16 ill-conditioned
                if ".lora." in name:
                    p.mul_(0.5)
        self.model.eval()
        self.reference = build(arch)[0]
        # two sentences, two hypotheses each (beam search's rows), four target prefixes
        src, lengths, _ = batch(seed=3, bsz=2)
        self.rows = torch.tensor([0, 0, 1, 1])
        self.sentences = (src, lengths)
        self.src, self.lengths = src[self.rows], lengths[self.rows]
        self.prev = batch(seed=4, bsz=4, tgt_len=6)[2]
        self.dtype = torch.float32

    # ---- weight changes --------------------------------------------------------------
    def _params(self) -> list[nn.Parameter]:
        params = [p for p in self.model.parameters() if p.is_floating_point()]
        k = max(1, len(params) // 2)
        return self.rng.sample(params, k)

    def _noise(self, p: torch.Tensor, scale: float = 0.05) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.rng.randrange(2**31))
        return (torch.randn(p.shape, generator=g, dtype=torch.float32) * scale).to(p.dtype)

    def _optimizer_step(self, make) -> None:
        params = self._params()
        for p in params:
            p.grad = self._noise(p, 1.0)
        opt = make(params)
        opt.step()
        for p in params:
            p.grad = None

    def change(self, how: str) -> None:
        model = self.model
        if how == "data_add":
            for p in self._params():
                p.data.add_(self._noise(p))
        elif how == "data_copy":  # an fp16 optimizer's copy from its fp32 master weights
            for p in self._params():
                p.data.copy_(p.data.float() + self._noise(p).float())
        elif how == "no_grad_add":
            with torch.no_grad():
                for p in self._params():
                    p.add_(self._noise(p))
        elif how == "fairseq_adam":
            self._optimizer_step(lambda ps: FairseqAdam(ps, lr=0.01))
        elif how in ("adam_fused", "adamw_fused", "sgd_fused"):
            cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
            optimizer = cls[how.split("_")[0]]
            self._optimizer_step(lambda ps: optimizer(ps, lr=0.01, fused=True))
        elif how == "vector_to_parameters":
            params = list(model.parameters())
            vec = parameters_to_vector(params).detach()
            vector_to_parameters(vec + self._noise(vec, 0.02), params)
        elif how == "load_state_dict":
            state = {
                k: v + self._noise(v, 0.02) if v.is_floating_point() else v
                for k, v in model.state_dict().items()
            }
            model.load_state_dict(state)
        elif how == "ema":  # an EMA of another model, written through .data
            for p in self._params():
                p.data.mul_(0.9).add_(p.data + self._noise(p, 0.5), alpha=0.1)
        elif how == "to_float64":
            model.double()
            self.dtype = torch.float64
        elif how == "to_float32":
            model.float()
            self.dtype = torch.float32
        else:
            assert how == "none", how

    # ---- the reference -----------------------------------------------------------------
    def _loaded_reference(self, dtype: torch.dtype) -> nn.Module:
        ref = self.reference.to(dtype)
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        ref.load_state_dict(state)
        return ref.train()

    def expected(self, rows: torch.Tensor | None = None, dtype=None) -> torch.Tensor:
        """The reference logits (training mode, gradients on: nothing derived is kept)."""
        ref = self._loaded_reference(dtype or self.dtype)
        src, lengths, prev = self.src, self.lengths, self.prev
        with torch.enable_grad():
            out = ref(src, lengths, prev)[0].detach()
        return out if rows is None else out[rows]

    # ---- checks --------------------------------------------------------------------------
    def full_pass(self, model: nn.Module) -> torch.Tensor:
        return model(self.src, self.lengths, self.prev)[0]

    def incremental(self, model: nn.Module, order: torch.Tensor) -> list[torch.Tensor]:
        """Logits step by step, the rows reordered by ``order`` after step 2 (beam search:
        each row continues a hypothesis of its own sentence)."""
        enc = model.encoder.reorder_encoder_out(model.encoder(*self.sentences), self.rows)
        state: dict = {}
        prev, out = self.prev, []
        for t in range(prev.size(1)):
            if t == 3:
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                prev = prev[order]
            out.append(model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0])
        return out

    def beam_order(self) -> torch.Tensor:
        """A reorder of beam search: every row takes one of its own sentence's hypotheses."""
        pick = [self.rng.randrange(2) for _ in range(4)]
        return torch.tensor([2 * (i // 2) + k for i, k in enumerate(pick)])

    def compare(self, got: torch.Tensor, want: torch.Tensor, dtype=None) -> str | None:
        tol = TOLERANCE[dtype or self.dtype]
        diff = (got.double() - want.double()).abs().max().item()
        if not diff <= tol * max(1.0, want.abs().max().item()):
            return f"max logit difference {diff:.3g}"
        return None

    def check(self, kind: str) -> str | None:
        model = self.model
        if kind == "eval":
            with torch.no_grad():
                return self.compare(self.full_pass(model), self.expected())
        if kind == "inference_mode":
            with torch.inference_mode():
                got = self.full_pass(model)
                order = self.beam_order()
                steps = self.incremental(model, order)
            return self.compare(got, self.expected()) or self._compare_steps(steps, order)
        if kind == "built_in_inference_mode":  # every parameter an inference tensor
            with torch.inference_mode():
                built = build(f"{self.family}_tiny")[0].to(self.dtype)
                built.load_state_dict(model.state_dict())
                for name, buffer in model.named_buffers():  # fairseq's sinusoids went through
                    built.get_buffer(name).copy_(buffer)  # the same dtype moves
                built.eval()
                got = self.full_pass(built)
                order = self.beam_order()
                steps = self.incremental(built, order)
            return self.compare(got, self.expected()) or self._compare_steps(steps, order)
        if kind == "incremental":
            order = self.beam_order()
            with torch.no_grad():
                steps = self.incremental(model, order)
            return self._compare_steps(steps, order)
        if kind == "hooks":
            return self._check_hooks()
        if kind == "quantized":
            return self._check_quantized()
        if kind == "half":
            return self._check_half()
        if kind == "compile":
            return self._check_compiled()
        raise AssertionError(kind)

    def _compare_steps(self, steps: list[torch.Tensor], order: torch.Tensor, dtype=None):
        want = self.expected(dtype=dtype)
        for t, got in enumerate(steps):
            rows = want if t < 3 else want[order]
            bad = self.compare(got[:, 0], rows[:, t], dtype)
            if bad:
                return f"step {t}: {bad}"
        return None

    def _shared_linears(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.decoder.stack.blocks.modules() if isinstance(m, nn.Linear)]

    def _check_hooks(self) -> str | None:
        """Forward hooks on the decoder's shared projections fire as often as in training,
        and the outputs are right."""

        def count(model: nn.Module, run) -> tuple[int, torch.Tensor]:
            calls = []
            handles = [
                m.register_forward_hook(lambda *_: calls.append(1))
                for m in self._shared_linears(model)
            ]
            try:
                out = run(model)
            finally:
                for h in handles:
                    h.remove()
            return len(calls), out

        ref = self._loaded_reference(self.dtype)
        order = self.beam_order()
        with torch.enable_grad():  # evaluation mode: ACT runs every level there (alignment)
            expected_calls, want = count(ref.eval(), self.full_pass)
        ref.train()
        with torch.no_grad():  # a cache's reorder writes into its buffers: no autograd
            expected_steps, _ = count(ref, lambda m: self.incremental(m, order))
        with torch.no_grad():
            calls, got = count(self.model, self.full_pass)
            step_calls, steps = count(self.model, lambda m: self.incremental(m, order))
        if (calls, step_calls) != (expected_calls, expected_steps):
            return (
                f"hooks fired {calls} times in an evaluation pass and {step_calls} in "
                f"decoding; in training {expected_calls} and {expected_steps}"
            )
        return self.compare(got, want.detach()) or self._compare_steps(steps, order)

    def _check_quantized(self) -> str | None:
        """Dynamic int8 quantisation of a copy: its evaluation pass and its decoding equal the
        same quantisation of a fresh instance loaded with the same weights."""
        qmodel = quantize_dynamic(copy.deepcopy(self.model).float(), {nn.Linear}, torch.qint8)
        # a fresh copy quantized now, in the same mode: activations are quantized per call with
        # scales of their own, so that the rounding of another path (training's, a full pass
        # for a step) moves logits by up to 0.2; each output is compared with its own
        ref = quantize_dynamic(copy.deepcopy(self._loaded_reference(torch.float32)).eval())
        order = self.beam_order()
        with torch.no_grad():
            want, got = self.full_pass(ref), self.full_pass(qmodel)
            want_steps = self.incremental(ref, order)
            steps = self.incremental(qmodel, order)
        bad = self.compare(got, want, torch.float32)
        for t, (step, expected) in enumerate(zip(steps, want_steps, strict=True)):
            bad = bad or self.compare(step, expected, torch.float32)
            if bad:
                return f"step {t}: {bad}"
        return bad

    def _check_half(self) -> str | None:
        """In float16, an fp16 optimizer's writes between evaluations (fairseq --fp16). The
        float16 reference (training's rank-space path) is itself rounded: the model's output is
        compared with the same weights in float32, and may be as far from it as twice the
        reference's own rounding and 0.03 of the logits' scale (a stale fold is 1 to 6 off)."""
        model, dtype = self.model, self.dtype
        model.half()
        self.dtype = torch.float16
        try:
            for _ in range(2):
                order = self.beam_order()
                with torch.no_grad():
                    got = [self.full_pass(model), *self.incremental(model, order)]
                half, exact = self.expected(), self.expected(dtype=torch.float32)
                for t, out in enumerate(got):
                    if t == 0:
                        ref, want = half, exact
                    else:
                        rows = slice(None) if t <= 3 else order
                        ref, want = half[rows][:, t - 1 : t], exact[rows][:, t - 1 : t]
                    rounding = (ref.float() - want).abs().max().item()
                    tol = 2 * rounding + TOLERANCE[torch.float16] * max(
                        1.0, want.abs().max().item()
                    )
                    diff = (out.float() - want).abs().max().item()
                    if not diff <= tol:
                        where = "the full pass" if t == 0 else f"step {t - 1}"
                        return (
                            f"{where}: {diff:.3g} from float32, float16's rounding {rounding:.3g}"
                        )
                self.change(self.rng.choice(HALF_CHANGES[1:]))
            return None
        finally:
            model.to(dtype)
            self.dtype = dtype

    def _check_compiled(self) -> str | None:
        """Full passes through torch.compile (aot_eager: no code generation), before and after
        a weight change, without graph breaks."""
        from torch._dynamo.utils import counters

        stacks = (self.model.encoder.stack, self.model.decoder.stack)
        settings = CompileSettings(backend="aot_eager")
        torch._dynamo.reset()
        counters.clear()
        for stack in stacks:
            stack.set_compile(settings)
        try:
            for step in range(2):
                with torch.no_grad():
                    bad = self.compare(self.full_pass(self.model), self.expected())
                if bad:
                    return f"compiled pass {step}: {bad}"
                self.change("data_add")
            breaks = sum(counters["graph_break"].values())
            if breaks:
                return f"{breaks} graph breaks: {dict(counters['graph_break'])}"
            return None
        finally:
            for stack in stacks:
                stack.set_compile(None)
            torch._dynamo.reset()


def run_cases(family: str, cases: int = CASES, seed: int = 0) -> tuple[list[Failure], Counter]:
    """Runs ``cases`` random (weight change, check) cases on ``family``; returns the failures
    and how often each check ran."""
    rng = random.Random(f"{family}-{seed}")
    harness = Harness(family, rng)
    failures, ran = [], Counter()
    for case in range(cases):
        change = rng.choice(CHANGES)
        kind = "compile" if case in COMPILE_AT else rng.choice(CHECKS)
        ran[kind] += 1
        try:
            harness.change(change)
            bad = harness.check(kind)
        except Exception as err:  # a crash is a failing case too
            bad = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
            harness.model.float()
            harness.dtype = torch.float32
        if bad:
            failures.append(Failure(case, change, kind, bad))
    return failures, ran


def _report(family: str, failures: list[Failure]) -> str:
    by_kind = Counter((f.change, f.check) for f in failures)
    lines = [f"{family}: {len(failures)} of {CASES} cases failed"]
    lines += [f"  {n} x change {c!r}, check {k!r}" for (c, k), n in by_kind.most_common()]
    lines += [f"  case {f.case}: {f.change} -> {f.check}: {f.what}" for f in failures[:15]]
    return "\n".join(lines)


@pytest.mark.filterwarnings("ignore:torch.ao.quantization is deprecated")
@pytest.mark.parametrize("family", list(FAMILIES))
def test_no_derived_tensor_outlives_the_weights(family):
    failures, ran = run_cases(family)
    assert set(ran) == {*CHECKS, "compile"}, ran
    assert not failures, _report(family, failures)


def test_the_reference_is_the_model():
    """The reference instance loaded with the model's weights gives the model's own training
    output (the comparison is meaningful), and a wrong weight is seen."""
    harness = Harness("ringformer", random.Random(0))
    with torch.enable_grad():
        own = harness.full_pass(harness.model.train()).detach()
    harness.model.eval()
    assert harness.compare(own, harness.expected()) is None
    with torch.no_grad():
        next(harness.model.decoder.stack.levels.parameters()).add_(1.0)
    assert harness.compare(own, harness.expected()) is not None
