"""Resolve which recipe, data and starting checkpoint a paper stage uses.

Stage 2 starts from stage 1's final checkpoint and stage 3 from stage 2's; stage 3 trains on the
hard subset mined with `rstar2 prepare hard` and resets the optimizer. A stage with `init_from`
continues the previous one: its weights, AdamW moments and LR-schedule position
(`checkpoint.continue_optimizer`), unless `optim.reset` asks for a fresh AdamW and warm-up
(stage 3, paper §4; the release ships one stage and no chaining, and a verl run started from a
model path, as each of its runs is, builds a fresh optimizer). Those links live in the
recipes (`init_from`), and this module turns them into concrete paths before anything starts,
so a missing checkpoint or data file is a one-line error at launch, not an hour later.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from rstar2_cli.config import ConfigError, RecipeConfig, load_recipe


def packaged_recipes() -> Path:
    """The recipes shipped inside the package (`rstar2_cli/recipes/`, package data of the wheel),
    so an installed `rstar2` (`pip install .`, the ROCm image) finds `--stage N` from any folder."""
    return Path(str(resources.files("rstar2_cli") / "recipes"))


def find_recipe(name_or_path: str) -> Path:
    """A path as given, else `recipes/<name>.yaml` in the working dir (a user's own copies win),
    else the packaged recipes."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    packaged = packaged_recipes()
    for root in (Path.cwd() / "recipes", packaged):
        for cand in (root / name_or_path, root / f"{name_or_path}.yaml"):
            if cand.is_file():
                return cand
    raise ConfigError(f"{name_or_path}: recipe not found (looked in ./recipes and {packaged})")


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
        prev = cfg.init_from
        prev_path = Path(prev)
        if prev_path.exists():
            cfg.model.path = str(prev_path)
        else:
            prev_cfg = load_recipe(find_recipe(prev))
            cfg.model.path = str(final_checkpoint(prev_cfg))
    if cfg.stage == 3 and not cfg.optim.reset:
        raise ConfigError(f"{path}: optim.reset: stage 3 starts with a fresh optimizer (set it true)")
    return cfg


def continues_optimizer(cfg: RecipeConfig) -> bool:
    """Whether a fresh run (not `--resume`) takes the previous stage's AdamW state and LR-schedule
    position from its `model.path` checkpoint."""
    return bool(cfg.init_from) and not cfg.optim.reset


def start_text(cfg: RecipeConfig) -> str:
    """What a fresh run of this recipe starts from, for the dry-run plan."""
    if not cfg.init_from:
        return f"starts from {cfg.model.path}: fresh AdamW, {cfg.optim.warmup_steps}-step LR warm-up"
    if cfg.optim.reset:
        return (f"continues {cfg.init_from} ({cfg.model.path}): its weights, a fresh AdamW and "
                f"{cfg.optim.warmup_steps}-step LR warm-up (optim.reset)")
    return (f"continues {cfg.init_from} ({cfg.model.path}): its weights, AdamW moments and LR-schedule "
            "position (optim.reset: false)")
