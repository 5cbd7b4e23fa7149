"""Multi-turn agent rollouts: generate, run the tool calls, append the results, repeat.

Why token ids end to end: the trainer must score exactly what the engine sampled, so a trajectory
is the engine's generated ids (loss mask 1, their sampling logprobs) interleaved with the
tokenized tool-response turns (loss mask 0, logprob 0.0). Generated text is decoded only to parse
calls and for logs; it is never re-tokenized.

The layout is the release's (rstar2_agent/rollout/rstar2_agent_loop.py on verl's ToolAgentLoop):
a turn ends on an end-of-turn token the policy samples; if it made a call, the tool turn
`<|im_start|>user\n<tool_response>...<|im_end|>\n<|im_start|>assistant\n<reason>` follows it
directly (the forced `<reason>` is template text: mask 0, logprob 0.0); a tool turn that does not
fit in the response budget ends the trajectory without being appended.

Why one asyncio task per trajectory: a trajectory sends its tool calls the moment its turn ends
and its next turn the moment the results are back, so generation of other trajectories keeps the
engines busy meanwhile (the paper's asynchronous tool dispatch) instead of waiting for the
slowest turn of a synchronized batch.

Engine death (`engine_health.py`): a turn whose replica died or hung raises `EngineDied`; with a
`recover` callback (the rollout host's `EngineSupervisor.recover`) the trajectory waits for the
restart, is reset to its prompt and rolled out again from its first turn with the same seeds
(its tool calls run again too): where the engine forwards request seeds (`rollout.seed_requests`,
on CPU under auto) it comes out as it would have without the fault, elsewhere it is a fresh sample
of the same prompt (rollout/generation.py); finished trajectories are untouched. Without one it
ends with finish_reason "error", as any engine error.
Engine errors (`generation.is_engine_failure`: vLLM's server-side errors, `EngineRequestError`)
end a trajectory with finish_reason "error" and infra_error "engine_error", which the trainer
leaves out (rl/selection/exclusion.py); any other exception is a bug and propagates.

Void turns (SimpleTIR, arXiv 2509.02479: a turn with neither code nor a final answer) are counted
per trajectory (`Trajectory.num_void_turns`): a turn that ended on a stop id with no well-formed
tool call (a malformed one, answered with a parse error, is no complete code block) and no answer
(`has_answer`). A turn cut by the response budget is not counted (it is clipped, `rollout/clip_ratio`).

Turn records (`Trajectory.turn_records`, read by `rl/logs/rollout_log.py`): per turn in order, its
role, its `span` [start, end) in `response_ids`, and what the loop knew: a generated turn's call
code and parse errors (`note_attempts`), a tool turn's status (`tool_status`); no text (a writer
decodes the spans of the few trajectories it logs). `Trajectory.num_repeated_code_calls`: calls whose
code (`call_code`) an earlier call of the same trajectory ran (the tool-loop alarm, rl/logs/loop_alarm.py).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rstar2_cli.config import RolloutConfig
from rstar2_cli.protocol.detokenize import ResponseDecoder, ids_decoder
from rstar2_cli.protocol.parser import ParseError, ToolCall, parse_tool_calls
from rstar2_cli.protocol.responses import response_text
from rstar2_cli.protocol.splice import PromptEncoder, ToolTurnEncoder
from rstar2_cli.protocol.template import eos_token_ids, single_token_id
from rstar2_cli.protocol.tools import ToolSpec, get_tools, tool_schemas
from rstar2_cli.rollout.engine_health import EngineDied
from rstar2_cli.rollout.generation import GenRequest, is_engine_failure
from rstar2_cli.rollout.trajectory import Trajectory, TurnRecord

log = logging.getLogger(__name__)


INFRA_TOOL_REASONS = frozenset({"internal_error"})  # sandbox failures that are not the model's doing
                                                 # (worker crash, queue timeout, remote backend error)
CALL_SEPARATOR = "\n# ---- next call ----\n"   # between the codes of one turn's calls in its record


def has_answer(turn_text: str) -> bool:
    """Whether a turn gives an answer: an `<answer>` tag or a `\\boxed{` (the prompts ask for both,
    protocol/template.py; the grader reads the boxed value)."""
    return "<answer>" in turn_text or "\\boxed{" in turn_text


def trajectory_seed(seed: int, prompt_id: str, sample_index: int, occurrence: int = 0) -> int:
    """A stable 31-bit seed per trajectory (independent of run order and of Python's hash salt).
    `occurrence` > 0: a later draw of the same problem in one batch gets seeds of its own; the
    first draw keeps the seed it always had."""
    name = prompt_id if occurrence == 0 else f"{prompt_id}@{occurrence}"
    digest = hashlib.blake2b(f"{seed}|{name}|{sample_index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def instance_key(prompt_id: str, sample_index: int, occurrence: int = 0) -> str:
    """Routing and sandbox-session key of one trajectory, unique per sampled instance."""
    return f"{prompt_id}#{sample_index}" if occurrence == 0 else f"{prompt_id}@{occurrence}#{sample_index}"


def occurrences(prompt_ids: list[str]) -> list[int]:
    """How many times each id appeared earlier in the list (0 for a first draw)."""
    seen: dict[str, int] = {}
    out = []
    for pid in prompt_ids:
        out.append(seen.get(pid, 0))
        seen[pid] = out[-1] + 1
    return out


@dataclass
class _LoopSetup:
    """What every trajectory of a run shares: tokenizer, tools, stop ids, and the exact fast paths
    from ids to text and from tool outputs to ids (protocol/detokenize.py, protocol/splice.py)."""
    tokenizer: Any
    cfg: RolloutConfig
    tools: dict[str, ToolSpec]
    stop_ids: list[int]
    eos_ids: list[int]
    decode: Callable[[list[int]], str]      # tokenizer.decode with special tokens kept
    tool_turn: ToolTurnEncoder              # responses.tool_turn_ids, spliced

    @classmethod
    def build(cls, tokenizer, cfg: RolloutConfig) -> "_LoopSetup":
        eos = eos_token_ids(tokenizer)
        # The release stops a turn only at end-of-turn; rollout.stop_at_tool_call also at </tool_call>.
        stops = eos + ([single_token_id(tokenizer, "</tool_call>")] if cfg.stop_at_tool_call else [])
        return cls(tokenizer, cfg, get_tools(cfg.tool), stops, eos, ids_decoder(tokenizer),
                   ToolTurnEncoder(tokenizer, cfg.force_reason))


async def _run_calls(attempts: list[ToolCall | ParseError], tool_runner, setup: _LoopSetup,
                     session: str) -> list[Any]:
    """Outcomes in call order: ParseErrors as they are, valid calls as sandbox RunResults."""
    calls = [(i, a) for i, a in enumerate(attempts) if isinstance(a, ToolCall)]
    outcomes: list[Any] = list(attempts)
    if calls:
        items = [setup.tools[c.name].run_item(c.arguments, session, setup.cfg.code_runner) for _, c in calls]
        results = await tool_runner.run_batch(items, timeout=setup.cfg.tool_timeout)
        if len(results) != len(items):
            raise RuntimeError(f"tool runner returned {len(results)} results for {len(items)} calls")
        for (i, _), r in zip(calls, results):
            outcomes[i] = r
    return outcomes


def call_code(call: ToolCall) -> str:
    """What makes two calls the same: the code a call runs (its arguments where it has no code)."""
    code = call.arguments.get("code")
    return code if isinstance(code, str) else repr(sorted(call.arguments.items()))


def note_attempts(turn: TurnRecord, attempts: list[ToolCall | ParseError]) -> None:
    """A generated turn's call attempts on its record: the code of its well-formed calls (several
    joined by `CALL_SEPARATOR`), the messages of its malformed ones; None where it has none."""
    codes = [c.arguments.get("code", c.raw) for c in attempts if isinstance(c, ToolCall)]
    errors = [a.message for a in attempts if isinstance(a, ParseError)]
    turn.tool_code = CALL_SEPARATOR.join(map(str, codes)) if codes else None
    turn.parse_error = "\n".join(errors) if errors else None


def tool_status(reasons: list[str]) -> str:
    """One tool turn's status from its calls' reasons: the first call that did not run cleanly
    decides ("parse_error"; sandbox "timeout"; "internal_error" -> "infra_error"; any other
    sandbox reason -> "error"), else "ok"."""
    for r in reasons:
        if r != "ok":
            return {"parse_error": "parse_error", "timeout": "timeout"}.get(
                r, "infra_error" if r in INFRA_TOOL_REASONS else "error")
    return "ok"


def record_versions(traj: Trajectory, res: Any, start: int, context_tokens: int) -> None:
    """One turn's versions: its first token's in `policy_versions`; with per-token spans (partial
    rollouts), each change of version in `version_spans` (at `start` + the span's offset), and a
    turn that spans an update counted as continued, with the context it re-prefilled on the new
    weights (`context_tokens` of prompt and earlier turns, plus the tokens it had sampled)."""
    traj.policy_versions.append(res.policy_version)
    spans = list(getattr(res, "version_spans", ()))
    for offset, version in spans:
        if not traj.version_spans or traj.version_spans[-1][1] != version:
            traj.version_spans.append([start + offset, version])
    if len(spans) > 1:
        traj.continued_turns += 1
        traj.recompute_tokens += sum(context_tokens + offset for offset, _ in spans[1:])


async def _rollout_one(traj: Trajectory, key: str, seed: int, generator, tool_runner,
                       setup: _LoopSetup, priority: int = 0) -> Trajectory:
    cfg = setup.cfg
    budget = cfg.max_response_tokens
    ids, mask, logprobs = traj.response_ids, traj.loss_mask, traj.logprobs
    reasons = traj.tool_outcomes      # per call: "ok", a sandbox failure reason, or "parse_error"
    turns = traj.turn_records         # per turn, its token span and what the loop knew
    seen_code: set[str] = set()
    used_session = False
    decoded = ResponseDecoder(setup.decode)   # the response's text, one piece per extend of `ids`
    try:
        while True:
            req = GenRequest(prompt_ids=traj.prompt_ids + ids, max_tokens=budget - len(ids),
                             temperature=cfg.temperature, top_p=cfg.top_p, stop_token_ids=setup.stop_ids,
                             seed=(seed + 1_000_003 * traj.num_turns) & 0x7FFFFFFF, logprobs=True,
                             priority=priority)
            res = await generator.generate(req, key=key)
            if len(res.logprobs) != len(res.token_ids):
                raise RuntimeError(f"engine returned {len(res.logprobs)} logprobs for {len(res.token_ids)} tokens")
            record_versions(traj, res, len(ids), len(req.prompt_ids))
            turns.append(TurnRecord("assistant", [len(ids), len(ids) + len(res.token_ids)]))
            ids.extend(res.token_ids)
            decoded.extend(res.token_ids)
            mask.extend([1] * len(res.token_ids))
            logprobs.extend(map(float, res.logprobs))
            traj.num_turns += 1
            if len(ids) >= budget or res.finish_reason == "length":
                traj.finish_reason = "length"
                break
            last = res.token_ids[-1] if res.token_ids else None
            turn_text = decoded.last()
            attempts = parse_tool_calls(turn_text, setup.tools, cfg.max_calls_per_turn,
                                        messages=cfg.parse_messages, unclosed_feedback=cfg.unclosed_tag_feedback)
            note_attempts(turns[-1], attempts)
            if (last in setup.stop_ids and not any(isinstance(a, ToolCall) for a in attempts)
                    and not has_answer(turn_text)):
                traj.num_void_turns += 1      # a complete turn with neither a well-formed call nor an answer
            # A turn continues only if it ended on a stop id (end-of-turn, or </tool_call> with
            # rollout.stop_at_tool_call) and made a call attempt.
            if not attempts or last not in setup.stop_ids:
                traj.finish_reason = "stop"
                break
            if traj.num_turns >= cfg.max_turns:
                traj.finish_reason = "max_turns"
                break
            started = time.monotonic()
            outcomes = await _run_calls(attempts, tool_runner, setup, key)
            traj.tool_time += time.monotonic() - started
            used_session = used_session or any(isinstance(a, ToolCall) and setup.tools[a.name].stateful
                                               for a in attempts)
            for o in outcomes:
                reasons.append("parse_error" if isinstance(o, ParseError) else o.reason)
            for a in attempts:
                if isinstance(a, ToolCall):
                    code = call_code(a)
                    traj.num_repeated_code_calls += code in seen_code
                    seen_code.add(code)
            traj.num_tool_calls += len(outcomes)
            infra = sum(r in INFRA_TOOL_REASONS for r in reasons[-len(outcomes):])
            traj.num_tool_errors += sum(r != "ok" for r in reasons[-len(outcomes):]) - infra
            if infra:
                traj.num_infra_tool_calls += infra
                traj.infra_error = traj.infra_error or "sandbox_internal_error"
            texts = [response_text(o, cfg.tool_response_max_chars, cfg.tool_timeout, cfg.response_format)
                     for o in outcomes]
            tool_ids = setup.tool_turn(texts, after_eos=last in setup.eos_ids)
            if len(ids) + len(tool_ids) >= budget:   # the release's rule: no partial tool turn
                traj.finish_reason = "length"
                break
            turns.append(TurnRecord("tool", [len(ids), len(ids) + len(tool_ids)],
                                    status=tool_status(reasons[-len(outcomes):])))
            ids.extend(tool_ids)
            decoded.extend(tool_ids)
            mask.extend([0] * len(tool_ids))
            logprobs.extend([0.0] * len(tool_ids))
    except EngineDied:
        raise                 # the caller restarts the engine and rolls this trajectory out again
    except Exception as e:  # an engine's failed request must not sink the batch; a bug must
        if not is_engine_failure(e):
            raise
        log.warning("trajectory %s failed: %r", key, e)
        traj.finish_reason = "error"
        traj.infra_error = "engine_error"
        traj.error = repr(e)
    finally:
        if used_session and hasattr(tool_runner, "close_session"):
            tool_runner.close_session(key)
    traj.text = decoded.text(ids)
    return traj


async def run_agent_loop(problems: list[tuple[str, str, str]], samples_per_problem: int, generator,
                         tool_runner, tokenizer, cfg: RolloutConfig, *, seed: int = 0,
                         progress: bool = True, group_indices: list[int] | None = None,
                         occurrence: list[int] | None = None, priority: int = 0,
                         recover: Callable[[EngineDied], Awaitable[None]] | None = None) -> list[Trajectory]:
    """Roll out `samples_per_problem` trajectories for each (prompt_id, problem_text, gold).

    Returns trajectories grouped by problem, in input order (sample_index 0..n-1 within a group).
    Each input position is one sampled instance: its trajectories carry `group_index` (the
    position, or `group_indices[position]`: the global batch position when this call rolls out a
    shard), and share one `prompt_ids` list (nothing changes a prompt in place; a copy per sample
    would be 32 copies of each prompt in a stage-2 step, each walked by every full garbage
    collection while the step's trajectories live). A problem listed twice is two instances;
    `occurrence[position]` (default: counted in this list) gives a later draw its own seeds and
    session keys. `priority`: the engines' request priority of every turn (lower first: the batch
    index, so older batches' turns go first).
    Raises if every trajectory failed (e.g. the engine is down), or on the first exception that is
    not an engine failure (a bug); otherwise failed ones come back with finish_reason "error" and
    infra_error "engine_error". `recover`: awaited with the
    `EngineDied` of a trajectory whose engine died, before it is rolled out again from its prompt
    (module docstring); what it raises ends the rollout.
    """
    if samples_per_problem < 1:
        raise ValueError(f"samples_per_problem must be >= 1, got {samples_per_problem}")
    group_indices = list(range(len(problems))) if group_indices is None else list(group_indices)
    occurrence = occurrences([p[0] for p in problems]) if occurrence is None else list(occurrence)
    if not len(group_indices) == len(occurrence) == len(problems):
        raise ValueError(f"{len(problems)} problems but {len(group_indices)} group indices and "
                         f"{len(occurrence)} occurrence counts")
    setup = _LoopSetup.build(tokenizer, cfg)
    schemas = tool_schemas(setup.tools, cfg.tool_schema_return) if cfg.tools_in_prompt else None
    encode_prompt = PromptEncoder(tokenizer, cfg.system_prompt, schemas, cfg.force_reason)
    trajs: list[Trajectory] = []
    jobs = []
    for (prompt_id, problem, gold), group, occ in zip(problems, group_indices, occurrence):
        prompt_ids = encode_prompt(problem)
        for k in range(samples_per_problem):   # one prompt list per problem, shared by its samples
            key, s = instance_key(prompt_id, k, occ), trajectory_seed(seed, prompt_id, k, occ)
            trajs.append(Trajectory(prompt_id=prompt_id, sample_index=k, group_index=group, prompt_ids=prompt_ids,
                                    gold=gold, instance_key=key, sampling_seed=s))
            jobs.append((trajs[-1], key, s))
    if not jobs:
        return []

    async def run_all(on_done=None) -> None:
        async def one(t, key, s):
            while True:
                try:
                    await _rollout_one(t, key, s, generator, tool_runner, setup, priority)
                    break
                except EngineDied as died:
                    if recover is None:
                        t.finish_reason, t.infra_error, t.error = "error", "engine_error", repr(died)
                        t.text = setup.decode(t.response_ids)
                        break
                    log.warning("trajectory %s: %s; rolled out again after the restart", key, died)
                    await recover(died)
                    vars(t).update(vars(Trajectory(prompt_id=t.prompt_id, sample_index=t.sample_index,
                                                   group_index=t.group_index, prompt_ids=t.prompt_ids,
                                                   gold=t.gold, instance_key=key, sampling_seed=s)))
            if on_done is not None:
                on_done(t)
        await asyncio.gather(*(one(*j) for j in jobs))

    if progress:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        # transient: the bar shows while the batch rolls out and leaves no line (the step's row says
        # the rest); off where the output is no terminal (a file, a job log), where it would leave one
        with Progress(TextColumn("rollout"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[info]}"), transient=True,
                      disable=not Console().is_terminal) as bar:
            task = bar.add_task("rollout", total=len(jobs), info="")
            stats = {"tool_calls": 0}

            def advance(t: Trajectory) -> None:
                stats["tool_calls"] += t.num_tool_calls
                bar.update(task, advance=1, info=f"tool calls {stats['tool_calls']}")
            await run_all(advance)
    else:
        await run_all()
    failed = [t for t in trajs if t.finish_reason == "error"]
    if len(failed) == len(trajs):
        raise RuntimeError(f"all {len(trajs)} trajectories failed; first error: {failed[0].error}")
    return trajs
