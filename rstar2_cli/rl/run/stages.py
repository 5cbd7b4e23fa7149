"""Resolve which recipe, data and starting checkpoint a paper stage uses.

Stage 2 starts from stage 1's final checkpoint and stage 3 from stage 2's; stage 3 trains on the
hard subset mined with `rstar2 prepare hard` and resets the optimizer. A stage with `init_from`
continues the previous one: its weights, AdamW moments and LR-schedule position
(`checkpoint.continue_optimizer`), unless `optim.reset` asks for a fresh AdamW and warm-up
(stage 3, paper §4; the release ships one stage and no chaining, and a verl run started from a
model path, as each of its runs is, builds a fresh optimizer). Those links live in the
recipes (`init_from`), and this module turns them into concrete paths before anything starts,
so a missing checkpoint or data file is a one-line error at launch, not an hour later.

Which files: `--stage N` (or a bare name such as `stage2`) is always the packaged recipe, from
any working folder; a user's own copy is used only when given as a path (`rstar2 rl
recipes/stage2.yaml`), and a differing `./recipes/stageN.yaml` beside a `--stage N` run is named
in one line (shadowed_recipe_note). `init_from: stageN` is the packaged stage-N recipe's
`train.out_dir/final` (`runs/stage1/final`), never a folder that happens to be called `stage1`;
`init_from: some/recipe.yaml` is that recipe's; anything else is a checkpoint path.
"""
from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from rstar2_cli.config import ConfigError, RecipeConfig, load_recipe


def packaged_recipes() -> Path:
    """The recipes shipped inside the package (`rstar2_cli/recipes/`, package data of the wheel),
    so an installed `rstar2` (`pip install .`, the ROCm image) finds `--stage N` from any folder."""
    return Path(str(resources.files("rstar2_cli") / "recipes"))


def find_recipe(name_or_path: str) -> Path:
    """A recipe file given by its path, else the packaged recipe of that name (`stage2`,
    `stage2.yaml`). A copy in ./recipes counts only when its path is given."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    packaged = _packaged(name_or_path)
    if packaged is None:
        raise ConfigError(f"{name_or_path}: recipe not found (no such file, and no packaged recipe of that name "
                          f"in {packaged_recipes()})")
    return packaged


def _packaged(name: str) -> Path | None:
    root = packaged_recipes()
    return next((c for c in (root / name, root / f"{name}.yaml") if c.is_file()), None)


def shadowed_recipe_note(recipe: str | None, stage: int | None) -> str | None:
    """One line when a recipe chosen by name (`--stage N`) is the packaged one while a differing
    `./recipes/<name>.yaml` sits in the working folder; None otherwise."""
    name = recipe if recipe is not None else f"stage{stage}"
    packaged = None if Path(name).is_file() else _packaged(name)
    local = Path("recipes") / (name if name.endswith(".yaml") else f"{name}.yaml")
    if packaged is None or not local.is_file() or local.read_bytes() == packaged.read_bytes():
        return None
    return (f"note: {local} differs from the packaged recipe; using the packaged one ({packaged}); "
            f"to use yours, give its path: rstar2 rl {local} ...")


def init_checkpoint(init_from: str) -> str:
    """The checkpoint an `init_from` names: `stageN` is the packaged stage-N recipe's final
    checkpoint, a recipe file's path that recipe's, anything else a checkpoint path as written."""
    if re.fullmatch(r"stage\d+", init_from):
        packaged = _packaged(init_from)
        if packaged is None:
            raise ConfigError(f"init_from: {init_from!r}: no packaged recipe of that name in {packaged_recipes()}")
        return str(final_checkpoint(load_recipe(packaged)))
    if init_from.endswith((".yaml", ".yml")) and Path(init_from).is_file():
        return str(final_checkpoint(load_recipe(Path(init_from))))
    return init_from


def final_checkpoint(cfg: RecipeConfig) -> Path:
    return Path(cfg.train.out_dir) / "final"


def resolve_stage_recipe(recipe: str | None, stage: int | None,
                         overrides: list[str] | None = None, *, on_gpu: bool | None = None) -> RecipeConfig:
    """Load the recipe for `stage` (or the file given), apply overrides and link the stages.
    `on_gpu`: where the run goes, for the recipe's placement rules (see `config.load_recipe_dict`)."""
    overrides = list(overrides or [])
    if recipe is None and stage is None:
        raise ConfigError("give a recipe file or --stage 1|2|3")
    path = find_recipe(recipe if recipe is not None else f"stage{stage}")
    cfg = load_recipe(path, overrides, on_gpu=on_gpu)
    if stage is not None and cfg.stage != stage:
        cfg.stage = stage
    user_set_model = any(o.split("=", 1)[0].strip() == "model.path" for o in overrides)
    if cfg.init_from and not user_set_model:
        cfg.model.path = init_checkpoint(cfg.init_from)
    if cfg.stage == 3 and not cfg.optim.reset:
        raise ConfigError(f"{path}: optim.reset: stage 3 starts with a fresh optimizer (set it true)")
    return cfg


def continues_optimizer(cfg: RecipeConfig) -> bool:
    """Whether a fresh run (not `--resume`) takes the previous stage's AdamW state and LR-schedule
    position from its `model.path` checkpoint."""
    return bool(cfg.init_from) and not cfg.optim.reset


def banner_text(cfg: RecipeConfig, done_steps: int) -> str:
    """The line a run opens with: which stage, which steps are left, where from and where to."""
    steps = (f"steps {done_steps + 1}..{cfg.train.steps}" if done_steps < cfg.train.steps
             else f"all {cfg.train.steps} steps done")
    where = f"resumed at step {done_steps}" if done_steps else start_text(cfg)
    return f"RL {cfg.name} (stage {cfg.stage}): {steps}, {where}; into {cfg.train.out_dir}"


def start_text(cfg: RecipeConfig) -> str:
    """What a fresh run of this recipe starts from, for the dry-run plan."""
    if not cfg.init_from:
        return f"starts from {cfg.model.path}: fresh AdamW, {cfg.optim.warmup_steps}-step LR warm-up"
    if cfg.optim.reset:
        return (f"continues {cfg.init_from} ({cfg.model.path}): its weights, a fresh AdamW and "
                f"{cfg.optim.warmup_steps}-step LR warm-up (optim.reset)")
    return (f"continues {cfg.init_from} ({cfg.model.path}): its weights, AdamW moments and LR-schedule "
            "position (optim.reset: false)")
