"""Build the RL math set (rStar2-Agent's 42K-style set) from several sources, with provenance.

Paper recipe: integer-answer problems pooled from DAPO-Math-17k, AoPS/OpenMathReasoning and
Project Euler, deduplicated, and any problem with an 8-gram overlap with MATH-500, AIME24/25 or
HMMT25 removed. Integer answers make the reward an exact check. Each stage here removes rows for
one stated reason, every removed row is written with its reason (`<out>.dropped.jsonl`), and the
inputs' sha256, licenses, field maps and settings go to `<out>.provenance.json`.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rstar2_cli.data import answer_checks, math_text
from rstar2_cli.data.decontaminate import DecontaminationConfig, decontaminate
from rstar2_cli.data.dedup import exact_dedup, near_dedup
from rstar2_cli.recipe_text import yaml_error_place, yaml_problem
from rstar2_cli.data.problems import (
    EVAL_SET_NAMES, HUB_IDS, NAMED_SETS, DataError, HubSource, Problem, data_stem, find_named_set_file, iter_rows,
    load_hub_source, load_problems, resolve_data_dir, rows_to_problems,
)

DROP_REASONS = (
    "empty_problem", "non_integer_answer", "float_artifact_answer", "positive_placeholder_answer",
    "exact_duplicate", "answer_conflict", "near_duplicate", "contaminated",
)


class SourceSpec(BaseModel):
    """One input: a local file, a named set (`dapo_math_17k`) or a hub dataset id."""

    model_config = ConfigDict(extra="forbid")
    path: str
    license: str = "unknown"
    name: str = ""
    id_field: str = "id"
    problem_field: str = "problem"
    answer_field: str = "answer"
    split: str = "train"  # hub ids only

    @classmethod
    def parse(cls, text: str) -> "SourceSpec":
        """`path[:license]` as given on the command line (the license part has no '/')."""
        path, sep, license_ = text.rpartition(":")
        if sep and path and "/" not in license_ and license_.strip():
            return cls(path=path, license=license_.strip())
        return cls(path=text)

    def display_name(self) -> str:
        if self.name:
            return self.name
        return data_stem(Path(self.path)) if Path(self.path).suffix else self.path


class PrepareMathConfig(BaseModel):
    """Settings for `prepare_math`, from CLI flags or a YAML spec (`--spec`)."""

    model_config = ConfigDict(extra="forbid")
    sources: list[SourceSpec] = Field(min_length=1)
    out: Path
    eval_sets: list[str] = Field(default_factory=lambda: list(EVAL_SET_NAMES))
    data_dir: str | None = None
    integer_only: bool = True
    drop_suspicious_answers: bool = True
    near_dup_threshold: float = Field(0.9, gt=0.0, le=1.0)
    ngram: int = Field(8, ge=1)
    boilerplate_min_problems: int = Field(10, ge=0)
    allow_hub: bool = True

    @field_validator("out")
    @classmethod
    def _out_suffix(cls, v: Path) -> Path:
        if v.suffix not in (".jsonl", ".parquet"):
            raise ValueError(f"--out must end in .jsonl or .parquet, got {str(v)!r}")
        return v

    @classmethod
    def from_yaml(cls, path: Path, **overrides: Any) -> "PrepareMathConfig":
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except OSError as e:
            raise DataError(f"{path}: cannot read spec: {e}") from None
        except yaml.YAMLError as e:
            raise DataError(f"{yaml_error_place(Path(path), e)}: not valid YAML ({yaml_problem(e)})") from None
        if not isinstance(data, dict):
            raise DataError(f"{path}: a spec is a mapping (sources:, out:, ...), got {type(data).__name__}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)


@dataclasses.dataclass
class PrepareMathReport:
    out: Path
    kept: int
    loaded: dict[str, int]
    dropped: dict[str, int]
    conflict_groups: int
    near_variants_kept: int
    contamination_hits: dict[str, int]
    cleaned: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["out"] = str(self.out)
        return d


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_source(spec: SourceSpec, data_dir: str | None, allow_hub: bool) -> tuple[list[Problem], dict]:
    """Problems of one source plus its provenance entry (resolved location, sha256 or hub id)."""
    fields = dict(id_field=spec.id_field, problem_field=spec.problem_field, answer_field=spec.answer_field)
    path = Path(spec.path)
    info: dict[str, Any] = {"spec": spec.path, "license": spec.license, "fields": fields}
    if path.exists():
        problems = rows_to_problems(iter_rows(path), str(path), spec.name or data_stem(path), **fields)
        info.update(resolved=str(path.resolve()), sha256=sha256_file(path))
    elif spec.path in NAMED_SETS:
        root = resolve_data_dir(data_dir)
        found = find_named_set_file(spec.path, root)
        if found is not None:
            problems = rows_to_problems(iter_rows(found), str(found), spec.name or spec.path, **fields)
            info.update(resolved=str(found.resolve()), sha256=sha256_file(found))
        elif allow_hub:
            hub = HUB_IDS[spec.path]
            problems = load_hub_source(hub, spec.name or spec.path)
            info.update(resolved=f"hub:{hub.dataset_id}", split=hub.split, fields=dataclasses.asdict(hub))
        else:
            raise DataError(f"{spec.path}: not found in data dir {root} and hub loading is disabled")
    elif "/" in spec.path and not path.suffix and allow_hub:
        hub = HubSource(spec.path, spec.split, spec.id_field, spec.problem_field, spec.answer_field)
        problems = load_hub_source(hub, spec.name or spec.path.split("/")[-1])
        info.update(resolved=f"hub:{spec.path}", split=spec.split)
    else:
        raise DataError(f"{spec.path}: no such file or named set ({', '.join(NAMED_SETS)})")
    return problems, info


def clean_problem(p: Problem, cleaned: Counter) -> Problem:
    """Stripped instructions, repaired escapes and a normalised answer (counts what changed)."""
    text = math_text.strip_format_instructions(p.problem)
    if text != p.problem.strip():
        cleaned["problem_text_repaired"] += 1
    answer = math_text.normalize_answer(p.answer)
    if answer != p.answer:
        cleaned["answer_normalized"] += 1
    return dataclasses.replace(p, problem=text, answer=answer)


def answer_drop_reason(p: Problem, config: PrepareMathConfig) -> str | None:
    if not p.problem:
        return "empty_problem"
    if config.integer_only and not math_text.is_integer_answer(p.answer):
        return "non_integer_answer"
    if config.drop_suspicious_answers:
        if answer_checks.is_float_artifact(p.answer):
            return "float_artifact_answer"
        if answer_checks.is_positive_placeholder(p.problem, p.answer):
            return "positive_placeholder_answer"
    return None


def unique_ids(problems: list[Problem]) -> list[Problem]:
    """Ids unique across sources: a colliding id gets its source name as prefix."""
    counts = Counter(p.id for p in problems)
    return [dataclasses.replace(p, id=f"{p.source}:{p.id}") if counts[p.id] > 1 else p for p in problems]


def write_problems(problems: Iterable[Problem], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [p.to_row() for p in problems]
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(
            [(k, pa.string()) for k in ("id", "problem", "answer", "source")])), out)
    else:
        with out.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def prepare_math(
    config: PrepareMathConfig, *, progress: Callable[[str, int, int], None] | None = None,
) -> PrepareMathReport:
    """Run the whole pipeline and write output, `<out>.dropped.jsonl` and `<out>.provenance.json`.

    `progress(stage, done, total)` is called as stages advance (the CLI draws a rich bar).
    """
    started = dt.datetime.now(dt.timezone.utc)
    step = progress or (lambda stage, done, total: None)
    all_rows: list[Problem] = []
    loaded: dict[str, int] = {}
    source_info = []
    for i, spec in enumerate(config.sources):
        step("load", i, len(config.sources))
        problems, info = load_source(spec, config.data_dir, config.allow_hub)
        loaded[spec.display_name()] = len(problems)
        info["rows"] = len(problems)
        for p in problems:
            p.extra["license"] = spec.license
        source_info.append(info)
        all_rows.extend(problems)
    step("load", len(config.sources), len(config.sources))

    dropped: list[tuple[Problem, str, str]] = []
    cleaned: Counter = Counter()
    candidates: list[Problem] = []
    for p in (clean_problem(p, cleaned) for p in unique_ids(all_rows)):
        reason = answer_drop_reason(p, config)
        if reason:
            dropped.append((p, reason, ""))
        else:
            candidates.append(p)

    exact = exact_dedup(candidates)
    dropped += [(p, "exact_duplicate", "") for p in exact.duplicates]
    for group in exact.conflict_groups:
        detail = "answers " + " vs ".join(sorted({p.answer for p in group})) + " in " + ", ".join(p.id for p in group)
        dropped += [(p, "answer_conflict", detail) for p in group]

    total = len(exact.kept)
    done = [0]

    def near_tick(n: int) -> None:
        done[0] += n
        if done[0] % 500 == 0 or done[0] == total:
            step("near-dedup", done[0], total)

    near = near_dedup(exact.kept, config.near_dup_threshold, progress=near_tick)
    dropped += [(p, "near_duplicate", "") for p in near.duplicates]

    step("decontaminate", 0, 1)
    eval_sets = {name: load_problems(name, data_dir=config.data_dir, allow_hub=config.allow_hub)
                 for name in config.eval_sets}
    decon = decontaminate(near.kept, eval_sets, DecontaminationConfig(
        ngram=config.ngram, boilerplate_min_problems=config.boilerplate_min_problems))
    dropped += [(p, "contaminated", ", ".join(decon.matches[p.id])) for p in decon.removed]
    step("decontaminate", 1, 1)

    write_problems(decon.kept, config.out)
    with config.out.with_name(config.out.name + ".dropped.jsonl").open("w", encoding="utf-8") as fh:
        for p, reason, detail in dropped:
            fh.write(json.dumps({"id": p.id, "source": p.source, "reason": reason, "detail": detail,
                                 "answer": p.answer, "problem": p.problem}, ensure_ascii=False) + "\n")
    reasons = Counter(reason for _, reason, _ in dropped)
    report = PrepareMathReport(
        out=config.out, kept=len(decon.kept), loaded=loaded,
        dropped={r: reasons.get(r, 0) for r in DROP_REASONS},
        conflict_groups=len(exact.conflict_groups), near_variants_kept=near.near_variants_kept,
        contamination_hits=decon.hits_per_eval_set, cleaned=dict(cleaned),
    )
    provenance = {
        "output": str(config.out), "output_sha256": sha256_file(config.out),
        "sources": source_info,
        "eval_sets": {name: len(v) for name, v in eval_sets.items()},
        "settings": config.model_dump(mode="json", exclude={"sources", "out"}),
        "counts": report.to_dict(),
        "started_utc": started.isoformat(), "finished_utc": dt.datetime.now(dt.timezone.utc).isoformat(),
    }
    provenance_path(config.out).write_text(json.dumps(provenance, indent=2, ensure_ascii=False) + "\n")
    return report


def provenance_path(out: Path) -> Path:
    return out.with_name(out.name + ".provenance.json")


def stats_table(report: PrepareMathReport):
    """A rich table of rows loaded, dropped per reason and kept."""
    from rich.table import Table

    table = Table(title=f"prepare math -> {report.out}")
    table.add_column("stage")
    table.add_column("rows", justify="right")
    for name, n in report.loaded.items():
        table.add_row(f"loaded: {name}", f"{n:,}")
    for reason, n in report.dropped.items():
        table.add_row(f"dropped: {reason}", f"{n:,}")
    for name, n in report.contamination_hits.items():
        table.add_row(f"  8-gram hits vs {name}", f"{n:,}")
    table.add_row("conflicting duplicate groups", f"{report.conflict_groups:,}")
    table.add_row("near-dup variants kept (other answer)", f"{report.near_variants_kept:,}")
    table.add_row("[bold]kept", f"[bold]{report.kept:,}")
    return table
