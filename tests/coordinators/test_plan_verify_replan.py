"""plan_verify_replan: plan a DAG, answer in waves, verify, replan, synthesize (after VMAO).

The planner, verifier and replanner are scripted with the simulated backend's
`[[backend.script]]` rules (purpose + regex -> output); sub-questions and the synthesis are
fresh simulated samples unless a rule answers them. Each VMAO stop rule is made to fire by
what the scripted verifier says; a bad plan is retried then refused; accepted results survive
replans; the budget is never exceeded (Hypothesis); a run cut anywhere, or SIGKILLed, resumes to
the uninterrupted result.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loop_processes import cli, finish

import lanefold
import lanefold.coordinators._plan_verify_replan  # registers the loop
from lanefold.cli import main
from lanefold.coordinators._plan import (
    PlanError,
    Progress,
    StopRules,
    SubQuestion,
    check_dag,
    fill,
    parse_plan,
    parse_replan,
    parse_verdict,
    stop_rule,
)
from lanefold.coordinators._plan_verify_replan import PlanVerifyReplanParams
from lanefold.primitives import AnyEvent, BudgetExhaustedError
from lanefold.stores.files import JsonlEventLog

QUESTION = "What is 17 * 23?"
ROOT = Path(__file__).resolve().parents[2]
NAME = "plan_verify_replan"


def plan_json(*nodes: tuple[str, str, list[str]]) -> str:
    return json.dumps({"subquestions": [{"id": i, "question": q, "depends_on": d} for i, q, d in nodes]})


THREE = plan_json(
    ("q1", "What is 17 * 20?", []),
    ("q2", "What is 17 * 3?", []),
    ("q3", "What is the sum of the two products?", ["q1", "q2"]),
)


def verdict(status: str, score: float, *missing: str) -> str:
    return "Here is my verdict:\n" + json.dumps({"status": status, "score": score, "missing": list(missing)})


def on(purpose: str, output: str, match: str | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"purpose": purpose, "output": output}
    if match is not None:
        rule["match"] = match
    return rule


def about(question: str) -> str:
    """A regex matching prompts whose first line asks `question`."""
    return "^Question: " + question.replace("*", r"\*").replace("?", r"\?")


def config(
    script: list[dict[str, Any]],
    loop: dict[str, Any] | None = None,
    backend: dict[str, Any] | None = None,
    **sections: Any,
) -> lanefold.LoopConfig:
    raw: dict[str, Any] = {
        "loop": {"coordinator": NAME, **(loop or {})},
        "sampling": {"max_tokens": 64},
        "log": {"fsync": "never"},
        "backend": {"kind": "simulated", "accuracy": 1.0, "script": script, **(backend or {})},
    }
    raw.update(sections)
    return lanefold.parse_config(raw)


def run(cfg: lanefold.LoopConfig, runs: Path, **kwargs: Any) -> lanefold.RunResult:
    return lanefold.run_sync(cfg, QUESTION, runs_dir=runs, **kwargs)


def events(result: lanefold.RunResult) -> list[AnyEvent]:
    assert result.events is not None
    return list(JsonlEventLog(result.events).read())


def mine(log: list[AnyEvent], noun: str) -> list[dict[str, Any]]:
    return [dict(e.data) for e in log if e.type == f"loop.{NAME}.{noun}"]


def waves(log: list[AnyEvent]) -> list[tuple[str, str, int]]:
    """(purpose, bill, lanes) of each wave, in order."""
    return [
        (e.data.purpose, e.data.bill, e.data.k)
        for e in log  # type: ignore[union-attr]
        if e.type == "wave.started"
    ]


# -- keys -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"max_nodes": 0}, "loop.max_nodes: Input should be greater than or equal to 1"),
        ({"batch_size": "3"}, "loop.batch_size: Input should be a valid integer"),
        ({"max_iteration": 3}, "loop.max_iteration: unknown key"),
        ({"ready_threshold": 1.5}, "loop.ready_threshold: Input should be less than or equal to 1"),
        ({"on_bad_plan": "guess"}, "loop.on_bad_plan: Input should be 'fail' or 'direct'"),
        (
            {"stop_rules": ["ready", "soon"]},
            "loop.stop_rules.1: Input should be 'ready', 'high_confidence' or 'diminishing_returns'",
        ),
        ({"stop_rules": ["ready", "ready"]}, "loop.stop_rules: a rule is named twice"),
        ({"verify_template": "Is {subquestion} right?"}, "loop.verify_template: must contain {result}"),
        (
            {"synthesis_template": "Combine."},
            "loop.synthesis_template: must contain {question} and {results}",
        ),
        ({"token_budget": 0}, "loop.token_budget: Input should be greater than or equal to 1"),
        ({"verifier_backend": "other"}, "loop.verifier_backend: Input should be 'main' or 'judge'"),
    ],
)
def test_keys_are_validated_naming_the_key(keys: dict[str, Any], error: str) -> None:
    with pytest.raises(lanefold.ConfigError) as caught:
        lanefold.parse_config({"loop": {"coordinator": NAME, **keys}}, source="pvr.toml")
    assert str(caught.value) == f"pvr.toml: {error}"


def test_the_defaults_are_vmaos_and_recorded_whole() -> None:
    cfg = lanefold.parse_config({"loop": {"coordinator": NAME}})
    assert cfg.loop_params == PlanVerifyReplanParams()
    rules = PlanVerifyReplanParams().rules()
    assert (
        rules.ready,
        rules.confidence,
        rules.confidence_complete,
        rules.min_gain,
        rules.max_iterations,
        rules.token_budget,
    ) == (0.8, 0.75, 0.5, 0.05, 3, None)
    recorded = cfg.model_dump()["loop"]
    assert set(PlanVerifyReplanParams.model_fields) <= set(recorded)
    assert recorded["batch_size"] == 3 and recorded["stop_rules"] == [
        "ready",
        "high_confidence",
        "diminishing_returns",
    ]


# -- the pure parts: JSON, DAG, stop rules -----------------------------------------------------------


def test_a_plan_is_read_from_prose_and_fences_with_numeric_ids() -> None:
    text = (
        "Sure! Here is the plan:\n```json\n"
        + json.dumps(
            {
                "subquestions": [
                    {"id": 1, "question": " First? ", "depends_on": []},
                    {"id": 2, "question": "Second?", "depends_on": [1], "notes": "extra keys are ignored"},
                ]
            }
        )
        + "\n```"
    )
    plan = parse_plan(text, max_nodes=4)
    assert [(s.id, s.question, s.depends_on) for s in plan.subquestions] == [
        ("1", "First?", ()),
        ("2", "Second?", ("1",)),
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("I would first compute 17 * 20.", "no JSON object in the reply"),
        ('{"steps": ["a", "b"]}', "the JSON does not have the shape asked for: subquestions: Field required"),
        ('{"subquestions": []}', "subquestions: Tuple should have at least 1 item"),
        (plan_json(("a", "A?", ["b"]), ("b", "B?", ["a"])), "the dependencies form a cycle: a -> b -> a"),
        (plan_json(("a", "A?", ["a"])), "sub-question 'a' depends on itself"),
        (plan_json(("a", "A?", []), ("b", "B?", ["z"])), "sub-question 'b' depends on unknown 'z'"),
        (plan_json(("a", "A?", []), ("a", "B?", [])), "sub-question id 'a' is used twice"),
        (
            plan_json(*[(f"q{i}", "Q?", []) for i in range(5)]),
            "5 sub-questions, more than loop.max_nodes (4)",
        ),
        (plan_json(("a b", "A?", [])), "id: Value error, an id is 1-32 letters"),
    ],
)
def test_a_bad_plan_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(PlanError) as caught:
        parse_plan(text, max_nodes=4)
    assert why in str(caught.value)


def test_a_longer_cycle_is_named_as_a_path() -> None:
    nodes = [
        SubQuestion(id="a", question="A?"),
        SubQuestion(id="b", question="B?", depends_on=("a", "d")),
        SubQuestion(id="c", question="C?", depends_on=("b",)),
        SubQuestion(id="d", question="D?", depends_on=("c",)),
    ]
    with pytest.raises(PlanError, match="cycle: b -> d -> c -> b"):
        check_dag(nodes, max_nodes=8)
    check_dag(
        [*nodes[:3], SubQuestion(id="d", question="D?", depends_on=("a",))], max_nodes=8
    )  # d not built on c: a DAG


def test_verdicts_and_replans() -> None:
    assert parse_verdict('{"status": "Complete"}').value == 1.0
    assert parse_verdict('{"status": "partial", "missing": "units"}').missing == ("units",)
    assert parse_verdict(verdict("failed", 0.2, "all of it")).value == 0.2
    with pytest.raises(PlanError, match="score: Input should be less than or equal to 1"):
        parse_verdict('{"status": "partial", "score": 7}')
    with pytest.raises(PlanError, match="status"):
        parse_verdict('{"status": "done", "score": 1}')
    nodes = [SubQuestion(id="q1", question="A?"), SubQuestion(id="q2", question="B?")]
    retry, add, kept = parse_replan(
        '{"retry": ["q1", "q2", "q2"], "add": [{"id": "q3", "question": "C?", "depends_on": ["q1"]}]}',
        nodes=nodes,
        accepted=["q1"],
        max_nodes=3,
    )
    assert (retry, [s.id for s in add], kept) == (["q2"], ["q3"], ["q1"])
    with pytest.raises(PlanError, match="retry names unknown sub-question 'q9'"):
        parse_replan('{"retry": ["q9"]}', nodes=nodes, accepted=[], max_nodes=3)
    with pytest.raises(PlanError, match=r"3 sub-questions, more than loop\.max_nodes"):
        parse_replan('{"add": [{"id": "q3", "question": "C?"}]}', nodes=nodes, accepted=[], max_nodes=2)
    with pytest.raises(PlanError, match="depends on unknown 'q7'"):
        parse_replan(
            '{"add": [{"id": "q3", "question": "C?", "depends_on": ["q7"]}]}',
            nodes=nodes,
            accepted=[],
            max_nodes=5,
        )


def test_templates_fill_their_slots_and_leave_other_braces() -> None:
    assert fill('{"a": "{x}", "b": {y}}', {"x": "{y}", "y": "2"}) == '{"a": "{y}", "b": 2}'


def progress(iteration: int, complete: int, confidence: float, nodes: int = 4, tokens: int = 0) -> Progress:
    return Progress(iteration, nodes, complete, confidence, tokens)


def test_the_stop_rules_as_pure_functions() -> None:
    rules = StopRules()
    assert stop_rule(progress(1, 4, 1.0), None, rules) == "ready"
    assert stop_rule(progress(1, 3, 0.5), None, rules) is None  # 0.75 complete: not ready
    assert stop_rule(progress(1, 2, 0.75), None, rules) == "high_confidence"
    assert stop_rule(progress(1, 1, 0.8), None, rules) is None  # 25% complete: not enough
    assert stop_rule(progress(2, 1, 0.44), progress(1, 1, 0.4), rules) == "diminishing_returns"
    assert stop_rule(progress(2, 1, 0.46), progress(1, 1, 0.4), rules) is None
    assert stop_rule(progress(3, 1, 0.6), progress(2, 1, 0.4), rules) == "max_iterations"
    budgeted = StopRules(token_budget=500)
    assert stop_rule(progress(1, 1, 0.4, tokens=499), None, budgeted) is None
    assert stop_rule(progress(1, 1, 0.4, tokens=500), None, budgeted) == "token_budget"
    only_ready = StopRules(rules=("ready",), max_iterations=5)
    assert stop_rule(progress(2, 2, 0.9), progress(1, 2, 0.9), only_ready) is None


# -- end to end on scripted outputs ----------------------------------------------------------------


def test_the_loop_plans_answers_in_dependency_waves_verifies_and_synthesizes(tmp_path: Path) -> None:
    cfg = config(
        [
            on("plan", THREE),
            # q3 is answered from its dependencies' answers, which its prompt carries.
            on(
                "sample",
                "Adding 340 and 51.\nAnswer: 391",
                about("What is the sum") + r"(.|\n)*- What is 17 \* 20\? -> 340\n- What is 17 \* 3\? -> 51",
            ),
            on("sample", "17 * 20 = 340.\nAnswer: 340", about("What is 17 * 20?")),
            on("sample", "17 * 3 = 51.\nAnswer: 51", about("What is 17 * 3?")),
            on("verify", verdict("complete", 0.95)),
            on("synthesize", "340 + 51 = 391.\nAnswer: 391", r"What is the sum of the two products\? -> 391"),
        ]
    )
    result = run(cfg, tmp_path)
    assert (result.status, result.answer) == ("answered", "391")
    log = events(result)
    assert waves(log) == [
        ("plan", "sample", 1),
        ("sample", "sample", 2),
        ("sample", "sample", 1),
        ("verify", "verifier", 3),
        ("synthesize", "sample", 1),
    ]
    assert result.outcome["winner_wave"] == 5
    outcome = result.outcome
    assert (outcome["stop"], outcome["iterations"], outcome["answered_by"]) == ("ready", 1, "synthesis")
    assert [(n["id"], n["status"], n["answer"]) for n in outcome["nodes"]] == [
        ("q1", "complete", "340"),
        ("q2", "complete", "51"),
        ("q3", "complete", "391"),
    ]
    [accepted] = mine(log, "plan_accepted")
    assert accepted["attempt"] == 1 and [s["id"] for s in accepted["subquestions"]] == ["q1", "q2", "q3"]
    assert [a["nodes"] for a in mine(log, "answering")] == [["q1", "q2"], ["q3"]]
    [iteration] = mine(log, "iteration")
    assert (iteration["complete"], iteration["completeness"], iteration["stop"]) == (3, 1.0, "ready")
    assert mine(log, "stopped") == [{"rule": "ready", "iteration": 1, "synthesis": True}]
    assert result.usage.verifier_tokens > 0, "the verifier is billed on its own line"


@pytest.mark.anyio
async def test_the_loop_runs_on_either_event_loop(tmp_path: Path) -> None:
    cfg = config([on("plan", THREE), on("verify", verdict("complete", 1.0))])
    result = await lanefold.run(cfg, QUESTION, runs_dir=tmp_path)
    assert result.status == "answered" and result.outcome["stop"] == "ready"


def test_batch_size_caps_a_wave(tmp_path: Path) -> None:
    wide = plan_json(*[(f"q{i}", f"Part {i}?", []) for i in range(5)])
    cfg = config([on("plan", wide), on("verify", verdict("complete", 1.0))], {"batch_size": 2})
    log = events(run(cfg, tmp_path))
    assert [k for purpose, _, k in waves(log) if purpose == "sample"] == [2, 2, 1]
    assert [k for purpose, _, k in waves(log) if purpose == "verify"] == [5]


# Each stop rule, fired by what the scripted verifier says.

PARTIAL = [
    on("plan", THREE),
    on("verify", verdict("partial", 0.5, "the units")),
    on("replan", '{"retry": ["q1", "q2", "q3"], "add": []}'),
]


@pytest.mark.parametrize(
    ("script", "loop", "rule", "iterations"),
    [
        pytest.param([on("plan", THREE), on("verify", verdict("complete", 0.9))], {}, "ready", 1, id="ready"),
        pytest.param(
            [
                on("plan", THREE),
                on("verify", verdict("failed", 0.4), about("What is 17 * 3")),
                on("verify", verdict("complete", 0.95)),
            ],
            {},
            "high_confidence",
            1,
            id="high-confidence",
        ),
        pytest.param(PARTIAL, {}, "diminishing_returns", 2, id="diminishing-returns"),
        pytest.param(
            PARTIAL, {"stop_rules": ["ready"], "token_budget": 200}, "token_budget", 1, id="token-budget"
        ),
        pytest.param(
            PARTIAL, {"stop_rules": ["ready"], "max_iterations": 2}, "max_iterations", 2, id="max-iterations"
        ),
        pytest.param(PARTIAL, {"stop_rules": ["ready"]}, "max_iterations", 3, id="max-iterations-default"),
    ],
)
def test_each_stop_rule_fires_on_what_the_verifier_says(
    tmp_path: Path, script: list[dict[str, Any]], loop: dict[str, Any], rule: str, iterations: int
) -> None:
    result = run(config(script, loop), tmp_path)
    assert (result.status, result.outcome["stop"], result.outcome["iterations"]) == (
        "answered",
        rule,
        iterations,
    )
    log = events(result)
    stops = [i["stop"] for i in mine(log, "iteration")]
    assert stops == [None] * (iterations - 1) + [rule]
    assert [s["rule"] for s in mine(log, "stopped")] == [rule]
    assert len(mine(log, "replan_accepted")) == iterations - 1
    if rule == "token_budget":
        assert mine(log, "iteration")[-1]["limit"] == "loop.token_budget"


def test_the_budget_stops_the_loop_cleanly_and_is_never_exceeded(tmp_path: Path) -> None:
    # Every call holds 64 prompt + 64 output tokens and spends 64 + 48. The plan and the three
    # answers fit in 700 tokens, each funded only with room for a synthesis after it; their
    # verification does not fit: the loop stops by the budget and still synthesizes.
    cfg = config(PARTIAL, {"json_max_tokens": 64}, budget={"max_tokens": 700})
    result = run(cfg, tmp_path)
    log = events(result)
    assert lanefold.fold(log, cfg.pricing).spend.tokens == 5 * 112 <= 700
    assert [p for p, _, _ in waves(log)] == ["plan", "sample", "sample", "synthesize"]
    assert [a["nodes"] for a in mine(log, "answering")] == [["q1", "q2"], ["q3"]]
    assert mine(log, "verifying") == [{"iteration": 1, "nodes": [], "unverified": ["q1", "q2", "q3"]}]
    assert mine(log, "iteration")[-1] | {"tokens": 0} == {
        "iteration": 1,
        "nodes": 3,
        "complete": 0,
        "completeness": 0.0,
        "confidence": 0.0,
        "tokens": 0,
        "stop": "token_budget",
        "limit": "budget",
    }
    assert (result.status, result.outcome["answered_by"]) == ("answered", "synthesis")
    assert {n["status"] for n in result.outcome["nodes"]} == {"unverified"}


def test_a_budget_that_cannot_fund_the_planner_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BudgetExhaustedError, match="planner"):
        run(config(PARTIAL, budget={"max_tokens": 100}), tmp_path)


def test_without_a_synthesis_the_answer_comes_from_the_last_sub_question(tmp_path: Path) -> None:
    script = [
        on("plan", THREE),
        on("verify", verdict("complete", 1.0)),
        on("sample", "Answer: 340", about("What is 17 * 20?")),
        on("sample", "Answer: 51", about("What is 17 * 3?")),
        on("sample", "Answer: 391", about("What is the sum")),
        on("synthesize", "I cannot combine these."),
    ]
    result = run(config(script), tmp_path)
    assert (result.answer, result.outcome["answered_by"]) == ("391", "fallback")
    assert result.outcome["winner_wave"] == 3, "the answer of q3, which nothing builds on"


# The plan: retried, refused, or replaced by the question itself.

GARBAGE = "I think we should first multiply, then add.\nAnswer: 391"


def test_a_bad_plan_is_retried_with_the_reason_and_a_good_retry_is_taken(tmp_path: Path) -> None:
    cycle = plan_json(("a", "A?", ["b"]), ("b", "B?", ["a"]))
    cfg = config(
        [
            on("plan", THREE, r"refused \(the dependencies form a cycle"),
            on("plan", cycle),
            on("verify", verdict("complete", 1.0)),
        ]
    )
    result = run(cfg, tmp_path)
    log = events(result)
    [rejected] = mine(log, "plan_rejected")
    assert (rejected["attempt"], rejected["retry"]) == (1, True)
    assert rejected["error"] == "the dependencies form a cycle: a -> b -> a"
    assert mine(log, "plan_accepted")[0]["attempt"] == 2
    assert [p for p, _, _ in waves(log)][:2] == ["plan", "plan"]
    assert result.outcome["plan"] == "planned"


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (GARBAGE, "no JSON object in the reply"),
        (plan_json(("a", "A?", ["b"]), ("b", "B?", ["a"])), "the dependencies form a cycle"),
        (plan_json(("a", "A?", ["x"])), "sub-question 'a' depends on unknown 'x'"),
        (
            plan_json(*[(f"q{i}", "Q?", []) for i in range(9)]),
            "9 sub-questions, more than loop.max_nodes (8)",
        ),
    ],
)
def test_a_bad_plan_fails_the_run_clearly_after_its_retries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reply: str, why: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"""
[loop]
coordinator = "{NAME}"
plan_attempts = 3
[backend]
kind = "simulated"
[[backend.script]]
purpose = "plan"
output = '''{reply}'''
""")
    runs = tmp_path / "runs"
    code = main(["run", str(path), "--question", QUESTION, "--runs-dir", str(runs), "--run-id", "bad"])
    err = capsys.readouterr().err
    assert code == 1
    [line] = err.strip().splitlines()
    assert "the planner gave no valid plan in 3 call(s)" in line and why in line
    log = list(JsonlEventLog(runs / "bad" / "events.jsonl").read())
    assert [p for p, _, _ in waves(log)] == ["plan"] * 3
    assert [r["retry"] for r in mine(log, "plan_rejected")] == [True, True, False]
    assert log[-1].type == "run.failed"
    assert log[-1].data.error == "PlanRejectedError"  # type: ignore[union-attr]


def test_a_bad_plan_may_fall_back_to_answering_the_question_directly(tmp_path: Path) -> None:
    cfg = config([on("verify", verdict("complete", 1.0))], {"on_bad_plan": "direct"})
    result = run(cfg, tmp_path)  # the planner is a plain sampler here: no JSON, ever
    log = events(result)
    assert [p for p, _, _ in waves(log)] == ["plan", "plan", "sample", "verify", "synthesize"]
    [accepted] = mine(log, "plan_accepted")
    assert accepted["fallback"] == "direct"
    assert accepted["subquestions"] == [{"id": "q1", "question": QUESTION, "depends_on": []}]
    assert (result.answer, result.outcome["plan"], result.outcome["stop"]) == ("391", "direct", "ready")


# Replans: accepted results are kept; retries carry what was missing; new nodes are added.


def test_accepted_results_are_kept_across_replans(tmp_path: Path) -> None:
    cfg = config(
        [
            on("plan", THREE),
            on("sample", "Let me redo it with units: 51 apples.\nAnswer: 51", "it missed: units"),
            on(
                "verify",
                verdict("failed", 0.1, "units"),
                about("What is 17 * 3") + r"(.|\n)*Proposed result:\n(?!Let me redo)",
            ),
            on("verify", verdict("complete", 0.9)),
            on(
                "replan",
                json.dumps(
                    {
                        "retry": ["q1", "q2"],
                        "add": [{"id": "q4", "question": "Check 391 / 23?", "depends_on": ["q3"]}],
                    }
                ),
            ),
        ],
        {"stop_rules": ["ready"], "ready_threshold": 1.0, "max_iterations": 3},
    )
    result = run(cfg, tmp_path)
    log = events(result)
    [replan] = mine(log, "replan_accepted")
    assert (replan["retry"], replan["kept"], [a["id"] for a in replan["add"]]) == (["q2"], ["q1"], ["q4"])
    answering = [a["nodes"] for a in mine(log, "answering")]
    assert answering == [["q1", "q2"], ["q3"], ["q2", "q4"]]
    assert sum("q1" in nodes for nodes in answering) == 1, "an accepted result is never redone"
    nodes = {n["id"]: n for n in result.outcome["nodes"]}
    assert {i: (n["status"], n["attempts"]) for i, n in nodes.items()} == {
        "q1": ("complete", 1),
        "q2": ("complete", 2),
        "q3": ("complete", 1),
        "q4": ("complete", 1),
    }
    assert result.outcome["stop"] == "ready" and result.outcome["iterations"] == 2


def test_a_bad_replan_retries_what_is_not_accepted(tmp_path: Path) -> None:
    cfg = config(
        [
            on("plan", THREE),
            on("verify", verdict("partial", 0.5), about("What is 17 * 3")),
            on("verify", verdict("complete", 1.0)),
            on("replan", '{"retry": ["q9"]}'),
        ],
        {"stop_rules": ["ready"], "ready_threshold": 1.0, "max_iterations": 2},
    )
    log = events(run(cfg, tmp_path))
    [rejected] = mine(log, "replan_rejected")
    assert rejected["error"] == "retry names unknown sub-question 'q9'"
    assert rejected["retry"] == ["q2"]
    assert [a["nodes"] for a in mine(log, "answering")][-1] == ["q2"]


def test_a_replan_with_nothing_to_do_ends_the_loop(tmp_path: Path) -> None:
    cfg = config(
        [on("plan", THREE), on("verify", verdict("partial", 0.5)), on("replan", '{"retry": [], "add": []}')]
    )
    result = run(cfg, tmp_path)
    assert (result.outcome["stop"], result.outcome["iterations"]) == ("no_new_work", 1)


def test_the_verifier_may_run_on_the_judge_backend(tmp_path: Path) -> None:
    judge = {"kind": "simulated", "script": [on("verify", verdict("complete", 1.0))]}
    cfg = config([on("plan", THREE)], {"verifier_backend": "judge"}, judge={"backend": judge})
    result = run(cfg, tmp_path)  # the main backend's verify replies are no JSON at all
    assert result.outcome["stop"] == "ready"
    log = events(result)
    assert all(v["parsed"] for v in mine(log, "verified")[0]["verdicts"].values())


def test_an_unreadable_verdict_counts_as_failed(tmp_path: Path) -> None:
    cfg = config([on("plan", THREE)], {"max_iterations": 1})
    result = run(cfg, tmp_path)
    [verified] = mine(events(result), "verified")
    assert {v["status"] for v in verified["verdicts"].values()} == {"failed"}
    assert not any(v["parsed"] for v in verified["verdicts"].values())
    assert result.outcome["stop"] == "max_iterations" and result.status == "answered"


# -- the budget is never exceeded ----------------------------------------------------------------


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limit=st.one_of(st.none(), st.integers(0, 1500)),
    failure=st.sampled_from([0.0, 0.3]),
    nodes=st.integers(1, 4),
    chain=st.booleans(),
    batch=st.integers(1, 3),
    iterations=st.integers(1, 3),
    status=st.sampled_from(["complete", "partial", "failed"]),
    max_tokens=st.integers(16, 96),
    seed=st.integers(0, 3),
)
def test_the_budget_is_never_exceeded(
    tmp_path_factory: pytest.TempPathFactory,
    limit: int | None,
    failure: float,
    nodes: int,
    chain: bool,
    batch: int,
    iterations: int,
    status: str,
    max_tokens: int,
    seed: int,
) -> None:
    plan = plan_json(*[(f"q{i}", f"Part {i}?", [f"q{i - 1}"] if chain and i else []) for i in range(nodes)])
    cfg = config(
        [
            on("plan", plan),
            on("verify", verdict(status, 0.5)),
            on("replan", '{"retry": ["q0"], "add": [{"id": "x", "question": "More?"}]}'),
        ],
        {
            "batch_size": batch,
            "max_iterations": iterations,
            "seed": seed,
            "on_bad_plan": "direct",
            "json_max_tokens": 48,
        },
        {"failure_rate": failure, "output_tokens": 40, "prompt_tokens": 30},
        sampling={"max_tokens": max_tokens},
        budget={"max_tokens": limit},
        retry={"max_attempts": 2, "initial_backoff_s": 0.0, "max_backoff_s": 0.0},
    )
    runs = tmp_path_factory.mktemp("runs")
    try:
        result = run(cfg, runs, run_id="r")
    except BudgetExhaustedError:
        log = list(JsonlEventLog(runs / "r" / "events.jsonl").read())
        assert not any(e.type == "wave.started" for e in log), "refused before any call"
        return
    state = lanefold.fold(JsonlEventLog(runs / "r" / "events.jsonl").read(), cfg.pricing)
    if limit is not None:
        assert state.spend.tokens <= limit
    assert result.status in ("answered", "no_answer")
    assert result.outcome["iterations"] <= iterations


# -- resume --------------------------------------------------------------------------------------

REPLANNED = [
    on("plan", THREE),
    on(
        "verify",
        verdict("failed", 0.2, "units"),
        about("What is 17 * 3") + r"(.|\n)*Proposed result:\n(?!Redone)",
    ),
    on("sample", "Redone with units.\nAnswer: 51", "it missed: units"),
    on("verify", verdict("complete", 0.9)),
    on("replan", '{"retry": ["q2"], "add": [{"id": "q4", "question": "Check?", "depends_on": ["q2"]}]}'),
]


def test_a_run_cut_at_any_event_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    cfg = config(REPLANNED, {"seed": 3}, {"accuracy": 0.5})
    base = run(cfg, tmp_path, run_id="base")
    assert base.outcome["iterations"] == 2 and base.outcome["stop"] == "ready"
    lines = Path(str(base.events)).read_text().splitlines(keepends=True)
    for cut in range(1, len(lines)):
        run(cfg, tmp_path, run_id=f"cut{cut}")
        log = tmp_path / f"cut{cut}" / "events.jsonl"
        log.write_text("".join(log.read_text().splitlines(keepends=True)[:cut]))
        again = lanefold.resume_sync(f"cut{cut}", runs_dir=tmp_path)
        assert (again.answer, again.winner_lane, again.outcome) == (
            base.answer,
            base.winner_lane,
            base.outcome,
        ), cut
        after = list(JsonlEventLog(log).read())
        kinds = Counter(e.type for e in after)
        assert kinds[f"loop.{NAME}.iteration"] == 2 and kinds[f"loop.{NAME}.stopped"] == 1, cut
        done = Counter((e.wave, e.lane) for e in after if e.type == "lane.completed")
        assert set(done.values()) == {1}, f"cut {cut}: a lane completed twice"


# -- a real crash: SIGKILL mid run, then resume ----------------------------------------------------


def toml_rules(rules: list[dict[str, Any]]) -> str:
    return "".join(
        "\n[[backend.script]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in rule.items())
        for rule in rules
    )


CRASH_CONFIG = """
[loop]
coordinator = "lanefold.coordinators._plan_verify_replan:PlanVerifyReplan"
seed = 7
max_concurrency = 1

[sampling]
max_tokens = 64

[backend]
kind = "simulated"
accuracy = 0.5
lanes_per_request = 1
latency_ms = [{latency}]
""" + toml_rules(REPLANNED)


def read(log: Path) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:  # the line being written
            break
    return found


@pytest.fixture
def crashed(tmp_path: Path) -> Iterator[Path]:
    """An uninterrupted run `base`, and a run `crash` SIGKILLed mid run: after its first
    iteration's verdicts, with a wave of the second iteration in flight."""
    runs = tmp_path / "runs"
    (tmp_path / "base.toml").write_text(CRASH_CONFIG.replace("{latency}", "0, 0"))
    (tmp_path / "crash.toml").write_text(CRASH_CONFIG.replace("{latency}", "100, 150"))
    code, _, err = finish(
        cli(
            tmp_path,
            "run",
            "base.toml",
            "--question",
            QUESTION,
            "--runs-dir",
            str(runs),
            "--run-id",
            "base",
            "--json",
        )
    )
    assert code == 0, err
    proc = cli(
        tmp_path, "run", "crash.toml", "--question", QUESTION, "--runs-dir", str(runs), "--run-id", "crash"
    )
    log = runs / "crash" / "events.jsonl"
    deadline = time.monotonic() + 60  # a bound on a hang, not a measured time
    try:
        while not any(e["type"] == "lane.dispatched" and e.get("wave", 0) >= 6 for e in read(log)):
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"the run never reached its sixth wave (exit {proc.poll()})")
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    yield runs


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_gives_the_uninterrupted_result(crashed: Path) -> None:
    before = read(crashed / "crash" / "events.jsonl")
    assert not any(e["type"] == "run.completed" for e in before)
    code, out, err = finish(cli(crashed.parent, "resume", "crash", "--runs-dir", str(crashed), "--json"))
    assert code == 0, err
    resumed = json.loads(out)
    base = read(crashed / "base" / "events.jsonl")[-1]["data"]["result"]
    assert (resumed["answer"], resumed["winner_lane"], resumed["outcome"]) == (
        base["answer"],
        base["winner_lane"],
        base["outcome"],
    )
    assert resumed["resumes"] == 1 and resumed["outcome"]["iterations"] == 2

    after = read(crashed / "crash" / "events.jsonl")
    completed = Counter((e["wave"], e["lane"]) for e in after if e["type"] == "lane.completed")
    assert set(completed.values()) == {1}, "no lane completed twice"
    kinds = Counter(e["type"] for e in after)
    assert kinds[f"loop.{NAME}.plan_accepted"] == 1 and kinds[f"loop.{NAME}.stopped"] == 1
    base_waves = [
        e["data"]["purpose"] for e in read(crashed / "base" / "events.jsonl") if e["type"] == "wave.started"
    ]
    assert [e["data"]["purpose"] for e in after if e["type"] == "wave.started"] == base_waves


# -- the example -----------------------------------------------------------------------------------


def test_the_example_config_validates() -> None:
    cfg = lanefold.load_config(ROOT / "examples" / "plan_verify_replan.toml")
    assert cfg.loop.coordinator == NAME
    assert cfg.backend.kind == "engine"
    assert cfg.loop_params.on_bad_plan == "direct"  # type: ignore[attr-defined]
