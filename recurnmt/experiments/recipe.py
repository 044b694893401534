"""Paper recipes: one YAML file per architecture x dataset, run by one command.

A recipe names a dataset preset, an architecture and the papers' training settings as
``fairseq-train`` / ``fairseq-generate`` options; ``run`` expands it into the commands and
runs them: training (one process or several, through :mod:`recurnmt.experiments.launch`), then the
evaluation of :func:`recurnmt.experiments.evaluation.evaluation_steps` (checkpoint averaging,
``fairseq-generate``, scoring into ``result.json``). The recipes live in ``configs/nmt/``
(see its README for the papers' settings and every choice the papers leave open).

Format (YAML)::

    extends: _a1_wmt14.yaml            # optional: file(s) merged first, relative to this one
    description: RingFormer, base size, WMT14 En-De
    paper: RingFormer appendix A.1
    dataset: wmt14                     # a preset of recurnmt.experiments.presets.PRESETS
    data: data-bin/wmt14_en_de         # optional, the preset's by default
    run_dir: runs/{name}               # optional: checkpoints/, generate output, result.json
    arch: ringformer_wmt_en_de
    paper_world_size: 2                # processes of the paper's batch (sets --update-freq)
    train: {lr: 7.0e-4, lr_scheduler: cosine, ...}   # fairseq-train options
    generate: {beam: 4}                # fairseq-generate options over the preset's
    evaluate: {average_last: 5}        # recurnmt.experiments.evaluation.EvalSettings

Option names are fairseq's flags with underscores; ``true`` is a bare flag, ``null`` removes
an inherited option; strings may use ``{name}``, ``{run_dir}`` and ``{data}``. Unknown keys
(also unknown fairseq options) are refused, naming the key.

Command line (``recurnmt-run-nmt-recipe``, also ``python -m recurnmt.experiments.recipe``)::

    recurnmt-run-nmt-recipe list
    recurnmt-run-nmt-recipe show ringformer_wmt14 [--override train.lr=5e-4]
    recurnmt-run-nmt-recipe run configs/nmt/ringformer_wmt14.yaml [--dry-run] \\
        [--override KEY=VALUE ...] [--steps train,evaluate] [--nproc 2 --device cuda ...]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from recurnmt.cli import entry_point
from recurnmt.experiments.commands import fairseq_flags, run_steps, train_command
from recurnmt.experiments.evaluation import EvalSettings, evaluation_steps
from recurnmt.experiments.launch import LaunchPlan, add_plan_arguments, launch, plan_from_args
from recurnmt.experiments.presets import PRESETS, DatasetPreset
from recurnmt.modules import ConfigError

PROG = "recurnmt-run-nmt-recipe"  # also python -m recurnmt.experiments.recipe
RECIPE_DIR = Path(__file__).resolve().parents[2] / "configs" / "nmt"
TOP_KEYS = {
    "extends": "base recipe file(s), merged first",
    "name": "the run's name (default: the file name)",
    "description": "one line for `recipe list`",
    "paper": "where the settings come from",
    "dataset": f"dataset preset: {', '.join(PRESETS)}",
    "data": "binarized data directory (default: the preset's)",
    "run_dir": "checkpoints, outputs and result.json (default: runs/{name})",
    "arch": "a registered fairseq architecture",
    "paper_world_size": "processes the paper's batch was split over",
    "train": "fairseq-train options",
    "generate": "fairseq-generate options",
    "evaluate": "averaging and scoring options",
}
SECTIONS = ("train", "generate", "evaluate")
EVAL_KEYS = {f.name for f in dataclasses.fields(EvalSettings)}
# set by the recipe itself; a train/generate section may not set them
RESERVED = {"user_dir", "arch", "save_dir", "source_lang", "target_lang", "path", "data"}


class RecipeError(ConfigError):
    """A recipe that cannot run; the message names the file and the key."""


@dataclass(frozen=True)
class Recipe:
    """A loaded, validated recipe with every default filled in.

    Attributes:
        name: the run's name.
        path: the recipe file.
        description: one line.
        paper: where the settings come from.
        preset: the dataset's standard settings.
        data: the binarized data directory (absolute).
        run_dir: the run's output directory (absolute); checkpoints in ``run_dir/checkpoints``.
        arch: the fairseq architecture.
        paper_world_size: processes of the paper's effective batch, if known.
        train: fairseq-train options.
        generate: fairseq-generate options (over the preset's).
        evaluate: averaging and scoring settings.
    """

    name: str
    path: Path
    description: str
    paper: str
    preset: DatasetPreset
    data: Path
    run_dir: Path
    arch: str
    paper_world_size: int | None
    train: dict[str, Any]
    generate: dict[str, Any]
    evaluate: EvalSettings

    @property
    def save_dir(self) -> Path:
        return self.run_dir / "checkpoints"


# --- loading -----------------------------------------------------------------------------------


def find_recipe(name_or_path: str | Path) -> Path:
    """A recipe file from a path or a name in ``configs/nmt/``.

    Raises:
        RecipeError: no such file (lists the known names).
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = RECIPE_DIR / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    known = ", ".join(p.stem for p in recipe_files())
    raise RecipeError(f"no recipe {name_or_path!r} (a file, or one of: {known})")


def recipe_files(directory: Path = RECIPE_DIR) -> list[Path]:
    """The runnable recipes of ``directory`` (files starting with ``_`` are bases)."""
    return sorted(p for p in directory.glob("*.yaml") if not p.name.startswith("_"))


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if key in SECTIONS and isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise RecipeError(f"{path}: 'extends' loops back to itself")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RecipeError(f"cannot read recipe {path}: {e}") from e
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of keys, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        allowed = "; ".join(f"{k}: {v}" for k, v in TOP_KEYS.items())
        raise RecipeError(f"{path}: unknown key(s) {', '.join(unknown)} (allowed: {allowed})")
    for section in SECTIONS:
        if raw.get(section) is not None and not isinstance(raw[section], dict):
            raise RecipeError(f"{path}: '{section}' must be a mapping of options")
    merged: dict[str, Any] = {}
    bases = raw.get("extends") or []
    for base in [bases] if isinstance(bases, str) else bases:
        merged = _merge(merged, _read(path.parent / base, (*seen, path)))
    merged = _merge(merged, {k: v for k, v in raw.items() if k != "extends"})
    return merged


def apply_override(raw: dict[str, Any], override: str) -> dict[str, Any]:
    """``KEY=VALUE`` or ``SECTION.KEY=VALUE`` (VALUE parsed as YAML) applied to ``raw``.

    Raises:
        RecipeError: malformed, or an unknown top-level key / section.
    """
    key, sep, text = override.partition("=")
    if not sep or not key:
        raise RecipeError(f"--override {override!r}: expected KEY=VALUE or SECTION.KEY=VALUE")
    value = yaml.safe_load(text) if text else None
    out = copy.deepcopy(raw)
    section, dot, option = key.partition(".")
    if dot:
        if section not in SECTIONS:
            raise RecipeError(f"--override {override!r}: sections are {', '.join(SECTIONS)}")
        out.setdefault(section, {})[option.replace("-", "_")] = value
    elif key not in TOP_KEYS or key == "extends":
        raise RecipeError(f"--override {override!r}: unknown key {key!r}")
    else:
        out[key] = value
    return out


def _fill(value: Any, fields: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        try:
            return value.format(**fields)
        except (KeyError, IndexError, ValueError):
            return value  # not a placeholder (e.g. "{'a': 1}")
    return value


def load_recipe(
    name_or_path: str | Path, overrides: Sequence[str] = (), base_dir: Path | None = None
) -> Recipe:
    """Reads, merges, overrides and checks a recipe.

    Args:
        name_or_path: a recipe file or a name in ``configs/nmt/``.
        overrides: ``KEY=VALUE`` / ``SECTION.KEY=VALUE`` strings.
        base_dir: directory that relative ``data`` / ``run_dir`` are taken from (cwd).

    Raises:
        RecipeError: unknown keys, a missing dataset or architecture, a bad value.
    """
    path = find_recipe(name_or_path)
    raw = _read(path)
    for override in overrides:
        raw = apply_override(raw, override)
    where = f"{path}"
    name = raw.get("name") or path.stem
    dataset = raw.get("dataset")
    if dataset not in PRESETS:
        raise RecipeError(f"{where}: dataset {dataset!r}: choose one of {', '.join(PRESETS)}")
    preset = PRESETS[dataset]
    arch = raw.get("arch")
    if not arch:
        raise RecipeError(f"{where}: no 'arch'")
    base_dir = Path.cwd() if base_dir is None else base_dir
    data = (base_dir / str(raw.get("data") or preset.data)).resolve()
    run_dir = (base_dir / str(raw.get("run_dir") or "runs/{name}").format(name=name)).resolve()
    fields = {"name": name, "run_dir": str(run_dir), "data": str(data)}
    sections = {s: dict(raw.get(s) or {}) for s in SECTIONS}
    for s in ("train", "generate"):
        clash = sorted(RESERVED & set(sections[s]))
        if clash:
            raise RecipeError(
                f"{where}: {s}.{clash[0]} is set by the recipe itself (use the top-level "
                "keys arch/data/run_dir/dataset)"
            )
        sections[s] = {k: _fill(v, fields) for k, v in sections[s].items()}
    unknown = sorted(set(sections["evaluate"]) - EVAL_KEYS)
    if unknown:
        raise RecipeError(
            f"{where}: unknown evaluate key(s) {', '.join(unknown)} "
            f"(allowed: {', '.join(sorted(EVAL_KEYS))})"
        )
    world = raw.get("paper_world_size")
    if world is not None and (not isinstance(world, int) or world < 1):
        raise RecipeError(f"{where}: paper_world_size must be a positive integer")
    return Recipe(
        name=name,
        path=path,
        description=str(raw.get("description") or ""),
        paper=str(raw.get("paper") or ""),
        preset=preset,
        data=data,
        run_dir=run_dir,
        arch=str(arch),
        paper_world_size=world,
        train=sections["train"],
        generate=sections["generate"],
        evaluate=EvalSettings(**sections["evaluate"]),
    )


# --- expansion ---------------------------------------------------------------------------------


def update_freq(recipe: Recipe, world_size: int) -> int | None:
    """``--update-freq`` that keeps the paper's effective batch on ``world_size`` processes.

    ``None`` when the recipe sets it itself, does not know the paper's processes, or the
    paper's count is not a multiple of ``world_size`` (then the effective batch differs).
    """
    if "update_freq" in recipe.train or recipe.paper_world_size is None:
        return None
    if recipe.paper_world_size % world_size:
        return None
    return recipe.paper_world_size // world_size


def train_argv(recipe: Recipe, world_size: int = 1) -> list[str]:
    """The fairseq-train arguments (data directory first), without distributed flags."""
    options = {
        "source_lang": recipe.preset.source_lang,
        "target_lang": recipe.preset.target_lang,
        "save_dir": str(recipe.save_dir),
        **recipe.train,
    }
    freq = update_freq(recipe, world_size)
    if freq and freq > 1:
        options["update_freq"] = freq
    return train_command(recipe.data, recipe.arch, fairseq_flags(options), start=())


def eval_steps(recipe: Recipe) -> list:
    """The evaluation commands of ``recipe`` (see :func:`evaluation_steps`)."""
    return evaluation_steps(
        recipe.preset,
        recipe.data,
        recipe.save_dir,
        recipe.run_dir,
        recipe.evaluate,
        recipe.generate,
        meta={"name": recipe.name, "arch": recipe.arch, "recipe": str(recipe.path)},
    )


def _unknown_flags(extra: Sequence[str]) -> list[str]:
    return [t.split("=", 1)[0] for t in extra if t.startswith("--")] or list(extra)


def validate(recipe: Recipe) -> Any:
    """Parses the recipe's commands with fairseq's own parsers.

    Returns:
        fairseq's parsed training arguments.

    Raises:
        RecipeError: an option fairseq does not know (named as the recipe key), an
            unregistered architecture, or a value fairseq rejects.
    """
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    import recurnmt.nmt  # noqa: F401  (registers the architectures)

    if recipe.arch not in ARCH_MODEL_REGISTRY:
        raise RecipeError(f"{recipe.path}: arch {recipe.arch!r} is not a registered architecture")
    checks = (
        ("train", options.get_training_parser, train_argv(recipe)),
        ("generate", options.get_generation_parser, [str(recipe.data), *generate_flags(recipe)]),
    )
    parsed = None
    for section, make_parser, argv in checks:
        usage = io.StringIO()  # argparse prints its usage and why, then exits
        try:
            with contextlib.redirect_stderr(usage):
                args, extra = options.parse_args_and_arch(make_parser(), argv, parse_known=True)
        except SystemExit as e:
            why = [
                line.split("error: ", 1)[1]
                for line in usage.getvalue().splitlines()
                if "error: " in line
            ]
            raise RecipeError(
                f"{recipe.path}: fairseq-{section} rejected the {section} options: "
                + (why[-1] if why else usage.getvalue().strip())
            ) from e
        if extra:
            keys = ", ".join(f"{section}.{f[2:].replace('-', '_')}" for f in _unknown_flags(extra))
            raise RecipeError(f"{recipe.path}: fairseq-{section} does not know {keys}")
        parsed = parsed or args
    return parsed


def generate_flags(recipe: Recipe) -> list[str]:
    """The fairseq-generate flags of the evaluation (without the data directory)."""
    for step in eval_steps(recipe):
        if step.stdout is not None:  # the generate step
            argv = list(step.argv)
            return argv[argv.index(str(recipe.data)) + 1 :]
    raise AssertionError("evaluation_steps has no generate step")


def check_data(recipe: Recipe) -> None:
    """Raises :class:`RecipeError` unless the recipe's data directory is prepared."""
    src, tgt = recipe.preset.source_lang, recipe.preset.target_lang
    missing = [f for f in (f"dict.{src}.txt", f"dict.{tgt}.txt") if not (recipe.data / f).is_file()]
    if missing:
        what = "does not exist" if not recipe.data.exists() else f"lacks {', '.join(missing)}"
        prepare = recipe.preset.prepare.format(data=recipe.data)
        raise RecipeError(
            f"data directory {recipe.data} {what} (recipe {recipe.name}, key 'data'): "
            f"prepare it with `{prepare}`, or point the recipe elsewhere with "
            "--override data=DIR"
        )


def run(
    recipe: Recipe,
    plan: LaunchPlan,
    stages: Sequence[str] = ("train", "evaluate"),
    dry_run: bool = False,
) -> int:
    """Runs (or prints) the stages of ``recipe``.

    Returns:
        The exit status (0 on success).
    """
    validate(recipe)
    if dry_run:
        if not recipe.data.exists():
            print(f"# note: {recipe.data} does not exist yet", flush=True)
    else:
        check_data(recipe)
    if "train" in stages:
        if recipe.paper_world_size and update_freq(recipe, plan.world_size) is None:
            if "update_freq" not in recipe.train:
                print(
                    f"# note: the paper's batch was split over {recipe.paper_world_size} "
                    f"process(es); on {plan.world_size} the effective batch is "
                    f"{plan.world_size / recipe.paper_world_size:g}x the paper's (adjust "
                    "train.max_tokens / train.batch_size to match)",
                    flush=True,
                )
        status = launch(plan, train_argv(recipe, plan.world_size), dry_run=dry_run)
        if status:
            return status
    if "evaluate" in stages and plan.node_rank == 0:
        status = run_steps(eval_steps(recipe), dry_run=dry_run)
        if status:
            return status
        if not dry_run:
            print(
                f"\nresult: {recipe.run_dir / 'result.json'}\ntable of every run: "
                f"recurnmt-results-nmt {recipe.run_dir.parent} "
                f"--markdown {recipe.run_dir.parent / 'results.md'} "
                f"--png {recipe.run_dir.parent / 'results.png'}"
            )
    return 0


# --- command line ------------------------------------------------------------------------------


def _show(recipe: Recipe) -> str:
    record = {
        "name": recipe.name,
        "description": recipe.description,
        "paper": recipe.paper,
        "dataset": recipe.preset.name,
        "data": str(recipe.data),
        "run_dir": str(recipe.run_dir),
        "arch": recipe.arch,
        "paper_world_size": recipe.paper_world_size,
        "train": recipe.train,
        "generate": recipe.generate,
        "evaluate": dataclasses.asdict(recipe.evaluate),
    }
    return yaml.safe_dump(record, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    """Lists, shows or runs recipes; returns the exit status of a run.

    Raises:
        RecipeError: a recipe that cannot run (names the file and the key).
        ConfigError: a launch that cannot work (names the option).
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the papers' translation recipes (configs/nmt/*.yaml).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the recipes in configs/nmt/")
    for name in ("show", "run"):
        p = sub.add_parser(name, help=f"{name} a recipe")
        p.add_argument("recipe", help="a recipe file or name (e.g. ringformer_wmt14)")
        p.add_argument(
            "--override",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="e.g. train.max_update=1000, data=DIR, evaluate.average_last=1",
        )
        if name == "run":
            p.add_argument("--dry-run", action="store_true", help="print the commands only")
            p.add_argument(
                "--steps", default="train,evaluate", help="comma-separated: train, evaluate"
            )
            add_plan_arguments(p)
    args = parser.parse_args(argv)
    if args.command == "list":
        for path in recipe_files():
            r = load_recipe(path)
            print(f"{r.name:36s} {r.description}")
        return 0
    recipe = load_recipe(args.recipe, args.override)
    if args.command == "show":
        print(_show(recipe), end="")
        return 0
    stages = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = sorted(set(stages) - {"train", "evaluate"})
    if bad:
        parser.error(f"--steps: unknown step(s) {', '.join(bad)}")
    return run(recipe, plan_from_args(args), stages, dry_run=args.dry_run)


cli = entry_point(main, PROG)  # the console script

if __name__ == "__main__":
    sys.exit(cli())
