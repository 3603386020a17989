"""What a training run paid, per step, optimizer and phase (history.json, plait train's table).

Every run here sends its calls to the loopback fake OpenAI server, which counts each
request it receives and the tokens it answered with; each alias names a model of its
own, so the server's records tell whose requests they were.  What the run says it
paid is checked against what the server received, request for request.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import cache, mock
from plait.learning import BootstrapFewShot, ExactMatch, Trainer
from tests.conftest import plait_cli, reset_fake_openai
from tests.test_learning_path import PIPELINE, TEST, TRAIN, VAL, examples, triage, write_jsonl

#: Dollars per million tokens (input, output) of each alias's model: large, so that a
#: handful of requests shows in the table's four decimals.
PRICES = {"fast": (1000.0, 2000.0), "teacher": (3000.0, 4000.0), "optimizer": (5000.0, 7000.0)}


def _resources_toml(server: Any, priced: bool = True) -> str:
    return "".join(
        f'[resources.{alias}]\nprovider = "openai"\nmodel = "m-{alias}"\n'
        f'base_url = "{server.base_url}"\napi_key = "sk-test"\n'
        + (f"input_price_per_mtok = {pin}\noutput_price_per_mtok = {pout}\n" if priced else "")
        for alias, (pin, pout) in PRICES.items()
    )


@pytest.fixture()
def project(server: Any, tmp_path: Path) -> Path:
    """A user's folder: the one-call triage pipeline, priced resources, 4 training, 3
    validation and 2 test examples; the server answers as the demonstrations shown do."""
    server.configure(answer_like_demos=True)
    (tmp_path / "triage.py").write_text(textwrap.dedent(PIPELINE), encoding="utf-8")
    (tmp_path / "resources.toml").write_text(_resources_toml(server), encoding="utf-8")
    write_jsonl(tmp_path / "train.jsonl", examples(TRAIN[:4]))
    write_jsonl(tmp_path / "val.jsonl", examples(VAL))
    write_jsonl(tmp_path / "test.jsonl", examples(TEST[:2]))
    return tmp_path


def _train(project: Path, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``plait train`` with bootstrap (its teacher on its own alias, one candidate) then
    sfa (its rewriter on the optimizer alias), two steps of two examples."""
    return plait_cli(
        *("train", "triage.py:Triage", "--data", "train.jsonl", "--val", "val.jsonl"),
        *("--test", "test.jsonl", "--optimizer", "bootstrap", "--optimizer", "sfa"),
        *("--candidates", "1", "--teacher-alias", "teacher", "--batch-size", "2"),
        *("--resources", "resources.toml", "--out", out, *extra),
        cwd=project,
    )


def _settled(server: Any) -> dict[str, Any]:
    """The server's stats once no request is still going: it records a request after
    writing its reply, so a client can have the reply a moment before."""
    import time

    deadline = time.monotonic() + 60
    while (stats := server.stats())["in_flight"]:
        assert time.monotonic() < deadline, f"{stats['in_flight']} request(s) still going"
        time.sleep(0.005)
    return dict(stats)


def _server_paid(server: Any) -> dict[str, list[int]]:
    """Per model: [requests, prompt tokens, completion tokens] the server answered (a
    request dropped unanswered is left out)."""
    paid: dict[str, list[int]] = {}
    for row in _settled(server)["requests"]:
        if row["status"] != 200:
            continue
        seen = paid.setdefault(row["model"], [0, 0, 0])
        seen[0] += 1
        seen[1] += row["prompt_tokens"]
        seen[2] += row["completion_tokens"]
    return paid


def _dollars(alias: str, tokens_in: int, tokens_out: int) -> float:
    price_in, price_out = PRICES[alias]
    return (tokens_in * price_in + tokens_out * price_out) / 1_000_000


def _triple(spend: dict[str, Any]) -> list[int]:
    return [spend["requests"], spend["input_tokens"], spend["output_tokens"]]


def _rounded(data: Any) -> Any:
    """``data`` with every dollar amount to the nano-dollar (sums of the same amounts in
    another order differ in the last bits)."""
    if isinstance(data, dict):
        return {key: _rounded(value) for key, value in data.items()}
    return round(data, 9) if isinstance(data, float) else data


def _table_rows(stderr: str) -> dict[tuple[str, str], list[str]]:
    """The spending table's rows, by (for, phase): requests, tokens in, out, cost."""
    rows = {}
    for line in stderr.splitlines():
        cells = [cell.strip() for cell in re.split(r"[│┃|]", line)[1:-1]]
        if len(cells) == 6 and cells[2] not in ("requests", ""):
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


def test_plait_train_reports_what_each_phase_and_optimizer_paid(project: Path, server: Any) -> None:
    """Was: history.json gave each step's requests and tokens in all, with no dollars
    and nothing telling the optimizers' proposals from their validation or the test."""
    ran = _train(project, "runs/one")
    assert ran.returncode == 0, ran.stderr
    paid = _server_paid(server)
    history = json.loads((project / "runs/one/history.json").read_text(encoding="utf-8"))
    spend = history["spend"]

    # Each request the server answered is counted once, with its tokens.
    everything = [sum(column) for column in zip(*paid.values(), strict=True)]
    assert _triple(spend["total"]) == everything
    # What each phase makes, known from the run's shape: 3 validation and 2 test
    # examples, two steps of two examples, one pipeline call per example.
    assert spend["initial"]["evaluating"]["requests"] == 3
    assert spend["initial"]["testing"]["requests"] == 2
    assert spend["minibatches"]["training"]["requests"] == 2 * 2
    boot, sfa = spend["optimizers"]["BootstrapFewShot"], spend["optimizers"]["SFAOptimizer"]
    assert boot["proposing"]["requests"] == 2 * 2  # the teacher runs each minibatch
    assert sfa["proposing"]["requests"] == 2 * 1  # one rewrite of the one instruction
    assert spend["final"] == {"testing": spend["final"]["testing"]}
    assert spend["final"]["testing"]["requests"] == 2
    # Each update that changed something is judged by one validation pass (3 calls).
    for step in history["steps"]:
        for trial in step["trials"]:
            judged = trial["spend"].get("evaluating", {"requests": 0})["requests"]
            assert judged == (3 if trial["tried"] else 0), trial
    changed = sum(bool(t["tried"]) for s in history["steps"] for t in s["trials"])
    assert changed >= 2
    assert boot["evaluating"]["requests"] + sfa["evaluating"]["requests"] == 3 * changed
    assert spend["phases"]["evaluating"]["requests"] == 3 + 3 * changed
    assert spend["phases"]["testing"]["requests"] == 4

    # The proposals are exactly the requests to the teacher's and the rewriter's models,
    # priced at theirs; the pipeline's model served training, evaluating and testing.
    teacher, rewriter, fast = paid["m-teacher"], paid["m-optimizer"], paid["m-fast"]
    assert _triple(boot["proposing"]) == teacher
    assert _triple(sfa["proposing"]) == rewriter
    assert boot["proposing"]["dollars"] == pytest.approx(_dollars("teacher", *teacher[1:]))
    assert sfa["proposing"]["dollars"] == pytest.approx(_dollars("optimizer", *rewriter[1:]))
    pipeline = [spend["phases"][name] for name in ("training", "evaluating", "testing")]
    assert [sum(column) for column in zip(*map(_triple, pipeline), strict=True)] == fast
    assert sum(p["dollars"] for p in pipeline) == pytest.approx(_dollars("fast", *fast[1:]))
    assert spend["total"]["dollars"] == pytest.approx(
        _dollars("fast", *fast[1:])
        + _dollars("teacher", *teacher[1:])
        + _dollars("optimizer", *rewriter[1:])
    )
    # A step's record holds its phases, and its trials' spend adds up to them.
    for step in history["steps"]:
        assert step["calls"] == sum(p["requests"] for p in step["spend"].values())
        assert step["spend"]["training"]["requests"] == 2
        proposing = sum(t["spend"]["proposing"]["requests"] for t in step["trials"])
        assert step["spend"]["proposing"]["requests"] == proposing == 2 + 1

    # The table at the end shows the same, a row per optimizer and phase, and totals.
    rows = _table_rows(ran.stderr)
    assert "plait train spending" in ran.stderr

    def cells(row: dict[str, Any]) -> list[str]:
        money = f"${row['dollars']:.4f}"
        return [
            str(row["requests"]),
            f"{row['input_tokens']:,}",
            f"{row['output_tokens']:,}",
            money,
        ]

    assert rows[("SFAOptimizer", "proposing")] == cells(sfa["proposing"])
    assert rows[("BootstrapFewShot", "proposing")] == cells(boot["proposing"])
    assert rows[("BootstrapFewShot", "evaluating")] == cells(boot["evaluating"])
    assert rows[("minibatches", "training")] == cells(spend["minibatches"]["training"])
    assert rows[("after training", "testing")] == cells(spend["final"]["testing"])
    assert rows[("all", "evaluating")] == cells(spend["phases"]["evaluating"])
    assert rows[("total", "")] == cells(spend["total"])

    # Quiet: no table on stderr, the same account in history.json (the run is the same).
    server.reset()
    server.configure(answer_like_demos=True)
    quiet = _train(project, "runs/quiet", "-q")
    assert quiet.returncode == 0, quiet.stderr
    assert "spending" not in quiet.stderr and "│" not in quiet.stderr
    again = json.loads((project / "runs/quiet/history.json").read_text(encoding="utf-8"))
    assert again["spend"] == spend


def test_without_prices_the_dollars_are_unknown_not_zero(project: Path, server: Any) -> None:
    (project / "resources.toml").write_text(_resources_toml(server, False), encoding="utf-8")
    ran = _train(project, "runs/unpriced", "--max-steps", "1")
    assert ran.returncode == 0, ran.stderr
    history = json.loads((project / "runs/unpriced/history.json").read_text(encoding="utf-8"))
    assert history["spend"]["total"]["requests"] == _settled(server)["requests_total"] > 0
    assert history["spend"]["total"]["dollars"] is None
    assert history["steps"][0]["spend"]["training"]["dollars"] is None
    assert _table_rows(ran.stderr)[("total", "")][3] == "-"


def test_calls_answered_by_a_cache_or_a_mock_cost_nothing(server: Any, tmp_path: Path) -> None:
    """A cache hit and a mocked reply never reach an endpoint: the second run, all
    answered by the cache the first one filled, pays nothing and says so."""
    endpoint = {"provider": "openai", "model": "m", "base_url": server.base_url}
    priced = {**endpoint, "api_key": "sk-test", "input_price_per_mtok": 1.0}
    resources = plait.ResourceConfig({"fast": {**priced, "output_price_per_mtok": 2.0}})

    def run() -> dict[str, Any]:
        model = triage()
        trainer = Trainer(
            model,
            ExactMatch(),
            BootstrapFewShot(model.parameters()),
            [(text, label) for text, label in TRAIN[:4]],
            VAL[:2],
            batch_size=2,
            resources=resources,
        )
        return trainer.fit_sync().spend

    with cache(tmp_path / "cache.sqlite"):
        first = run()
        paid = _settled(server)["requests_total"]
        assert first["total"]["requests"] == paid > 0
        assert first["total"]["dollars"] > 0
        server.reset()
        second = run()
    assert _settled(server)["requests_total"] == 0
    assert second["total"] == {"requests": 0, "input_tokens": 0, "output_tokens": 0, "dollars": 0.0}

    with mock({"fast": "billing"}):
        mocked = run()
    assert _settled(server)["requests_total"] == 0
    assert mocked["total"]["requests"] == 0


def _logged_calls(directory: Path) -> int:
    total = 0
    for log in directory.glob("calls-*/log.jsonl"):
        data = log.read_bytes()
        total += sum(1 for line in data.split(b"\n")[:-1] if b'"t":"call"' in line)
    return total


def _wait_logged(directory: Path, count: int, proc: Any) -> None:
    """Return once ``count`` calls are in the log (a state, polled as `wait_parked` polls)."""
    import time

    deadline = time.monotonic() + 120
    while (seen := _logged_calls(directory)) < count:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"only {seen} of {count} calls were logged"
        time.sleep(0.01)


def test_a_killed_and_resumed_run_counts_each_paid_request_once(project: Path, server: Any) -> None:
    """Killed (SIGKILL) in its first step's minibatch, with the initial scores saved,
    two of the minibatch's calls completed and one waiting at the server; resumed, the
    run's totals are what the server received from both processes: the calls the
    killed run completed are counted once (the resumed run has them from its call
    log, free), the one in flight at the kill is a request each process sent."""
    gate = "spendkill"
    # The first example of the first minibatch (drawn as the run draws it) waits.
    model = triage()
    drawn = Trainer(model, ExactMatch(), BootstrapFewShot(model.parameters()), TRAIN[:4])
    server.configure(gate_texts={drawn.batches(0)[0][0][0]: gate})

    def command(out: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "plait.cli",
            "train",
            "triage.py:Triage",
            *("--data", "train.jsonl", "--val", "val.jsonl", "--test", "test.jsonl"),
            *("--optimizer", "bootstrap", "--optimizer", "sfa", "--candidates", "1"),
            *("--teacher-alias", "teacher", "--batch-size", "2"),
            *("--resources", "resources.toml", "--out", out, "-q"),
        ]

    server.close_gate(gate)
    proc = subprocess.Popen(
        command("runs/killed"),
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        server.wait_parked(gate, 1)
        # 3 validation, 2 test and the minibatch's other call are logged.
        _wait_logged(project / "runs/killed/checkpoint", 3 + 2 + 1, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Requests the server received (the one parked included) and the replies it gave.
    # (The server drops the parked request once its client is gone.)
    killed_sent, killed_paid = _settled(server)["requests_total"], _server_paid(server)
    assert killed_sent == 3 + 2 + 2
    reset_fake_openai(server)
    server.configure(answer_like_demos=True)
    resumed = subprocess.run(
        command("runs/killed"), cwd=project, capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    resumed_sent, resumed_paid = _settled(server)["requests_total"], _server_paid(server)

    reset_fake_openai(server)
    server.configure(answer_like_demos=True)
    whole = subprocess.run(
        command("runs/whole"), cwd=project, capture_output=True, text=True, timeout=120
    )
    assert whole.returncode == 0, whole.stderr

    def history(out: str) -> dict[str, Any]:
        return json.loads((project / out / "history.json").read_text(encoding="utf-8"))

    got, want = history("runs/killed")["spend"], history("runs/whole")["spend"]
    # What both processes sent, in all: each request once.
    assert got["total"]["requests"] == killed_sent + resumed_sent
    replies = [
        sum(paid[model][i] for paid in (killed_paid, resumed_paid) for model in paid)
        for i in (1, 2)
    ]
    # The request in flight at the kill was sent twice; its reply (its tokens) came once.
    assert got["total"]["requests"] == want["total"]["requests"] + 1
    assert _triple(got["total"])[1:] == _triple(want["total"])[1:] == replies
    assert got["total"]["dollars"] == pytest.approx(want["total"]["dollars"])
    # It was a minibatch request of the first step; everything else is as in one run.
    step = history("runs/killed")["steps"][0]["spend"]["training"]
    assert (
        step["requests"] == history("runs/whole")["steps"][0]["spend"]["training"]["requests"] + 1
    )
    got["phases"]["training"]["requests"] -= 1
    got["minibatches"]["training"]["requests"] -= 1
    got["total"]["requests"] -= 1
    assert _rounded(got) == _rounded(want)
    # A finished run leaves no log of its spending behind.
    assert not list((project / "runs/killed/checkpoint").glob("spend-*"))


def test_reading_a_history_written_before_spending_was_counted(tmp_path: Path) -> None:
    """An old history.json (and the history inside an old checkpoint) has no spending."""
    from plait.learning.history import TrainingHistory

    old = {
        "initial_val_score": 0.5,
        "best_val_score": 0.5,
        "stopped": "completed",
        "steps": [
            {
                "step": 1,
                "epoch": 0,
                "batch": 0,
                "train_score": 0.5,
                "train_loss": 0.5,
                "val_score": 0.5,
                "kept": False,
                "improved": False,
                "calls": 4,
                "tokens": 40,
            }
        ],
    }
    history = TrainingHistory.from_json(old)
    assert history.spend == {} and history.steps[0].spend == {}
    assert history.to_json()["steps"][0]["calls"] == 4


def test_passes_on_ray_workers_are_counted_as_in_one_process(
    project: Path, server: Any, ray_cluster: Any
) -> None:
    """With ``--workers 2`` the minibatches and the validation passes run in worker
    processes: each worker's requests come back to the run's account under the phase
    and optimizer the pass was sent for, as one process counts them."""
    alone = _train(project, "runs/alone", "-q")
    assert alone.returncode == 0, alone.stderr
    sent = _settled(server)["requests_total"]
    reset_fake_openai(server)
    server.configure(answer_like_demos=True)
    address = ray_cluster.get_runtime_context().gcs_address
    # (An absolute --out: workers of a running cluster do not share this directory.)
    workers = ("--workers", "2", "--ray-address", address)
    spread = _train(project, str(project / "runs/workers"), "-q", *workers)
    assert spread.returncode == 0, spread.stderr
    assert _settled(server)["requests_total"] == sent

    def spend(out: str) -> Any:
        history = json.loads((project / out / "history.json").read_text(encoding="utf-8"))
        return _rounded(
            [
                history["spend"],
                *([s["spend"], *(t["spend"] for t in s["trials"])] for s in history["steps"]),
            ]
        )

    on_workers = spend("runs/workers")
    assert on_workers == spend("runs/alone")
    assert on_workers[0]["total"]["requests"] == sent
    assert on_workers[0]["phases"]["evaluating"]["requests"] > 0


def test_fresh_starts_over_after_a_run_killed_before_its_first_checkpoint(
    project: Path, server: Any
) -> None:
    """Killed during its initial validation, a run leaves its call log and the log of
    what it paid; ``--fresh`` deletes both, and the new run counts only its own."""
    gate = "firstval"
    server.configure(gate_texts={VAL[0][0]: gate})
    server.close_gate(gate)
    argv = [sys.executable, "-m", "plait.cli", "train", "triage.py:Triage"]
    argv += ["--data", "train.jsonl", "--val", "val.jsonl", "--optimizer", "bootstrap"]
    argv += ["--max-steps", "1", "--resources", "resources.toml", "--out", "runs/t", "-q"]
    proc = subprocess.Popen(
        argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        server.wait_parked(gate, 1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = sorted(entry.name for entry in (project / "runs/t/checkpoint").iterdir())
    assert "trainer.json" not in left and any(name.startswith("spend-") for name in left)
    reset_fake_openai(server)
    server.configure(answer_like_demos=True)
    fresh = subprocess.run(
        [*argv, "--fresh"], cwd=project, capture_output=True, text=True, timeout=120
    )
    assert fresh.returncode == 0, fresh.stderr
    history = json.loads((project / "runs/t/history.json").read_text(encoding="utf-8"))
    assert history["spend"]["total"]["requests"] == _settled(server)["requests_total"]


def test_calls_of_two_phases_running_at_once_are_told_apart(server: Any) -> None:
    """The phase travels with each call, so work of two phases interleaved on one event
    loop (a search proposing while it evaluates) is split exactly, request by request."""
    import asyncio

    from plait.learning.spend import SpendLedger, account, phase

    resources = plait.ResourceConfig(
        {
            alias: {
                "provider": "openai",
                "model": f"m-{alias}",
                "base_url": server.base_url,
                "api_key": "sk-test",
                "input_price_per_mtok": 1.0,
                "output_price_per_mtok": 1.0,
            }
            for alias in ("fast", "optimizer")
        }
    )
    evaluate = plait.LLMInference("fast", "Score it.").bind(resources=resources)
    propose = plait.LLMInference("optimizer", "Rewrite it.").bind(resources=resources)

    async def run(name: str, module: Any, count: int) -> None:
        with phase(name):
            await asyncio.gather(*(module(f"{name} text {i}") for i in range(count)))

    async def both() -> None:
        with account(("step", 1, 0)):
            await asyncio.gather(run("evaluating", evaluate, 7), run("proposing", propose, 3))

    ledger = SpendLedger()
    with ledger:
        asyncio.run(both())
    spent = ledger.spent()
    paid = _server_paid(server)
    assert _triple(spent["evaluating"].to_json()) == paid["m-fast"]
    assert _triple(spent["proposing"].to_json()) == paid["m-optimizer"]
    assert paid["m-fast"][0] == 7 and paid["m-optimizer"][0] == 3
    assert ledger.spent(("step", 1, 0).__eq__).keys() == {"evaluating", "proposing"}


def test_the_same_requests_give_the_same_account_in_any_order() -> None:
    """Was: a run's dollars were a float sum in reply order, so the same run written
    twice could read 0.6 and 0.6000000000000001 (CI compared two such and failed)."""
    from plait.learning.spend import Spend

    costs = [0.1, 0.2, 0.3]
    forward, backward = Spend(), Spend()
    for cost in costs:
        forward.add(Spend(1, dollars=cost))
    for cost in reversed(costs):
        backward.add(Spend(1, dollars=cost))
    assert forward.dollars != backward.dollars  # the floats themselves differ
    assert forward.to_json() == backward.to_json()
    assert forward.to_json()["dollars"] == 0.6
