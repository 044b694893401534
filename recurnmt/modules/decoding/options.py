"""The decoding options, declared once: what a front end may ask of recurnmt's decoding.

Each option is a field of :class:`DecodingOptions`, a
:class:`~recurnmt.modules.declarations.Settings` group declared with
:func:`~recurnmt.modules.declarations.option` as a stack option is: its neutral name, default,
help, how its text reads (:attr:`~recurnmt.modules.declarations.Option.parse`). Everything
else is derived from that declaration:

* fairseq's task fields (``--draft-levels``, ``--draft-tokens``, ``--static-decoding``,
  ``--compile-decoding``, in ``fairseq-generate`` and ``fairseq-interactive``:
  ``recurnmt.nmt.speculative``) and their help;
* ``generate()``'s keywords of the ``transformers`` model (``draft_levels=2``:
  ``recurnmt.hf.generation``);
* the checks (:meth:`DecodingOptions.check` among the options, :meth:`DecodingOptions.check_stack`
  against the decoder that decodes), which raise a
  :class:`~recurnmt.modules.errors.ConfigError` naming the option by its name; each front end
  renames it to its own spelling (a flag, a keyword).

Adding a decoding option is one field here and the code that uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recurnmt.modules.declarations import Settings, option
from recurnmt.modules.errors import ConfigError

AUTO = "auto"  # draft_levels: the fastest depth on the first batch
EXIT_TESTS = ("margin", "saturation", "classifier")  # exit_test (modules/decoding/exits.py)
# what each test's confidence can be: a threshold outside never or always exits
THRESHOLDS = {"margin": (0.0, 1.0), "saturation": (-1.0, 1.0), "classifier": (0.0, 1.0)}


def _draft_levels(text: Any, options: Mapping[str, Any]) -> int | str | None:
    """A draft depth's text: a number of levels, or ``auto``; None: no speculation."""
    if text is None or text == AUTO:
        return text
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ConfigError("draft_levels", text, "a number of levels, or auto") from None


def _exit_test(text: Any, options: Mapping[str, Any]) -> str | None:
    """An exit test's name (None: no exits)."""
    if text is None or text in EXIT_TESTS:
        return text
    raise ConfigError("exit_test", text, f"choose one of {', '.join(EXIT_TESTS)}")


@dataclass(frozen=True)
class DecodingOptions(Settings):
    """How a recurnmt decoder decodes, beside the search's own settings (beam, lengths,
    sampling).

    Attributes:
        draft_levels: self-speculative decoding with drafts from the decoder's first R levels
            (:mod:`~recurnmt.modules.decoding.speculative`): R in 1 .. N - 1, 0 for the same
            loop without drafts, ``auto`` for the fastest R on the first batch; None: no
            speculation.
        draft_tokens: K, the tokens drafted per verification.
        static_decoding: beam search over fixed shapes (every row kept, a static-shape
            cache: :mod:`~recurnmt.modules.decoding.static_steps`), what a CUDA graph replays.
        compile_decoding: the decoding steps compiled by ``torch.compile`` (static decoding,
            or speculation's passes and rounds).
        exit_test: per-row exits from the level loop (:mod:`~recurnmt.modules.decoding.exits`),
            one of :data:`EXIT_TESTS`; None: every row runs every level.
        exit_threshold: the confidence at which a row exits.
        min_exit_level: the fewest levels a row runs (1 .. N - 1).
        exit_classifier: the file of the ``classifier`` test's units.
    """

    draft_levels: Any = option(
        None,
        "decode with drafts from the decoder's first R levels (1 .. N-1; 0: no draft, "
        "recurnmt's own loop; auto: the fastest R on the first batch); greedy (a beam of 1) "
        "or sampling",
        parse=_draft_levels,
        metavar="R",
    )
    draft_tokens: int = option(4, "tokens drafted per verification", type=int)
    static_decoding: bool = option(
        False,
        "beam search over fixed shapes: every row kept, the decoder's keys and values in "
        "buffers of the longest output, reordered in place (what a captured CUDA graph step "
        "needs); outputs equal fairseq's beam search",
        action="store_true",
    )
    compile_decoding: bool = option(
        False,
        "static decoding (or speculation's passes, with drafts) with each step compiled by "
        "torch.compile (TorchInductor's fused kernels; a C++ compiler on a CPU): faster "
        "sentence by sentence on a CPU; eager, with a warning, where compiling fails",
        action="store_true",
    )

    exit_test: str | None = option(
        None,
        "rows leave a decoding step's level loop once this test passes (margin: top-1 minus "
        "top-2 probability; saturation: cosine of consecutive levels' states; classifier: a "
        "learned unit per level, {exit_classifier}); the levels they skip get keys and values "
        "from their exit state; any search (beam, greedy, sampling)",
        parse=_exit_test,
        metavar="{" + ",".join(EXIT_TESTS) + "}",
    )
    exit_threshold: float = option(
        0.9, "a row exits where its confidence is at least this", type=float, metavar="T"
    )
    min_exit_level: int = option(1, "the fewest decoder levels a row runs", type=int, metavar="R")
    exit_classifier: str | None = option(
        None,
        "the exit units (recurnmt-exits train) for {exit_test} classifier",
        metavar="FILE",
    )

    @property
    def speculative(self) -> bool:
        """Whether decoding drafts (or runs speculation's loop without drafts: 0)."""
        return self.draft_levels is not None

    @property
    def static(self) -> bool:
        """Whether beam search runs over fixed shapes (asked for, or implied by compiling
        without drafts)."""
        return self.static_decoding or (self.compile_decoding and not self.speculative)

    @property
    def asked(self) -> str | None:
        """The option that asks for recurnmt's own decoding (None: the search's default)."""
        for name in ("draft_levels", "compile_decoding", "static_decoding", "exit_test"):
            if getattr(self, name) not in (None, False):
                return name
        return None

    def check(self) -> None:
        """The options' rules among themselves (when the group is made; against a decoder:
        :meth:`check_stack`)."""
        if self.static_decoding and self.speculative:
            raise ConfigError(
                "static_decoding", True, "not with {draft_levels} (beam search or drafts)",
                {"draft_levels": self.draft_levels},
            )  # fmt: skip
        if not isinstance(self.draft_tokens, int) or self.draft_tokens < 1:
            raise ConfigError("draft_tokens", self.draft_tokens, "at least 1 drafted token")
        self._check_exits()

    def _check_exits(self) -> None:
        test = self.exit_test
        if test != "classifier" and self.exit_classifier is not None:
            raise ConfigError("exit_classifier", self.exit_classifier, "is read by {exit_test} "
                              "only", {"exit_test": "classifier"})  # fmt: skip
        if test is None:
            return
        for name in ("draft_levels", "static_decoding", "compile_decoding"):
            if getattr(self, name) not in (None, False):
                raise ConfigError(
                    "exit_test", test, f"not with {{{name}}}: exits change the rows a level "
                    "runs, which drafts and fixed shapes do not", {name: getattr(self, name)},
                )  # fmt: skip
        low, high = THRESHOLDS[test]
        t = self.exit_threshold
        if not isinstance(t, (int, float)) or not low <= t <= high:
            raise ConfigError(
                "exit_threshold", t, f"the {test} test's confidence lies in [{low:g}, {high:g}]"
            )
        if not isinstance(self.min_exit_level, int) or self.min_exit_level < 1:
            raise ConfigError("min_exit_level", self.min_exit_level, "at least 1 level")
        if test == "classifier" and not self.exit_classifier:
            raise ConfigError("exit_classifier", self.exit_classifier, "the classifier test "
                              "reads its units from a file (recurnmt-exits train writes one)")  # fmt: skip

    def check_stack(self, num_levels: int, act: bool) -> None:
        """The draft and the exits against a decoder of ``num_levels`` levels (``act``: ACT's
        halting)."""
        if self.exit_test is not None:
            if act:
                raise ConfigError(
                    "exit_test", self.exit_test, "ACT's halting decides each position's depth "
                    "itself ({act})", {"act": "on"},
                )  # fmt: skip
            if not self.min_exit_level < num_levels:
                raise ConfigError(
                    "min_exit_level", self.min_exit_level,
                    f"rows exit after 1 to {num_levels - 1} of the decoder's {num_levels} levels",
                )  # fmt: skip
        if not self.speculative:
            return
        levels = self.draft_levels
        if act:
            raise ConfigError(
                "draft_levels", levels, "ACT's halting mixes the outputs of every level "
                "({act}), so the first levels are no draft of the model; decode without "
                "speculation", {"act": "on"},
            )  # fmt: skip
        if levels == AUTO:
            if num_levels < 2:
                raise ConfigError(
                    "draft_levels", levels, f"the decoder has {num_levels} level, nothing to draft"
                )
            return
        if not isinstance(levels, int) or not 0 <= levels < num_levels:
            raise ConfigError(
                "draft_levels", levels,
                f"the draft runs 1 to {num_levels - 1} of the {num_levels} levels (0: no draft)",
            )  # fmt: skip
