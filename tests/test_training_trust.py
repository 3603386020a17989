"""`plait train` / `Trainer` fail clearly and never pay twice (issue 20: 5, 10, 12, 16).

The classifier and rewriter helpers of `tests.test_trainer` decide each step's
outcome; calls that must be counted go to the loopback fake server.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import mock
from plait.learning.losses import Contains, Loss
from plait.learning.optimizers import SFAOptimizer
from plait.learning.trainer import HISTORY_FILE, Trainer, TrainerError
from tests.test_trainer import Classifier, classify, dataset


def _strict_json(text: str) -> Any:
    """``json.loads`` that refuses the NaN/Infinity tokens Python writes by default."""

    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


# -- point 12: a NaN score is an error, and history.json is always JSON --------------------------
class RatioLoss(Loss):
    """A hand-written loss that divides by the target's length: NaN for an empty target."""

    def forward(self, output: Any, target: Any = None) -> float:
        return float(str(output) == str(target)) if target else math.nan


def test_a_nan_score_stops_training_naming_the_loss_and_the_example(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    model = Classifier()
    data = [*dataset(3), ("a good thing with no label", "")]
    trainer = Trainer(
        model,
        RatioLoss(),
        SFAOptimizer(model.parameters(), alias="smart"),
        data,
        batch_size=4,
        checkpoint_dir=tmp_path,
        resources=resources,
    )
    with (
        mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True),
        pytest.raises(TrainerError) as caught,
    ):
        trainer.fit_sync()
    message = str(caught.value)
    assert "RatioLoss" in message and "nan" in message
    assert "a good thing with no label" in message
    # Nothing was trained on it, and what is on disk is strict JSON.
    assert trainer.history.steps == []
    history = tmp_path / HISTORY_FILE
    if history.exists():
        _strict_json(history.read_text(encoding="utf-8"))


def test_history_json_is_strict_json_even_for_a_nan_score(tmp_path: Path) -> None:
    from plait.learning.trainer import StepRecord, TrainingHistory

    history = TrainingHistory(initial_val_score=0.5, best_val_score=0.5)
    history.steps.append(StepRecord(1, 0, 0, math.nan, math.nan, None, False, False))
    with pytest.raises(ValueError):
        history.save(tmp_path / "history.json")
    assert not (tmp_path / "history.json").exists()


# -- the command ---------------------------------------------------------------------------------
PIPELINE = """
import plait

class Classifier(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", system_prompt=plait.Parameter("Label it.", description="Labelling."),
            demos=[],
        )

    def forward(self, text: str):
        return self.llm(text)
"""


def write_rows(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text(
        "".join(json.dumps({"input": text, "target": label}) + "\n" for text, label in rows),
        encoding="utf-8",
    )
    return path


def command(tmp_path: Path, base_url: str, *extra: str) -> list[str]:
    """``plait train`` of a one-call classifier on the fake server, data in tmp_path."""
    target = tmp_path / "pipeline.py"
    if not target.exists():
        target.write_text(PIPELINE, encoding="utf-8")
        endpoint = {"provider": "openai", "model": "m", "base_url": base_url, "api_key": "sk-test"}
        config = {alias: endpoint for alias in ("fast", "optimizer")}
        (tmp_path / "resources.yaml").write_text(json.dumps(config), encoding="utf-8")
        write_rows(tmp_path / "train.jsonl", dataset(4))
        write_rows(tmp_path / "val.jsonl", dataset(4))
        write_rows(tmp_path / "test.jsonl", dataset(6))
        write_rows(tmp_path / "other.jsonl", dataset(5))
    return [
        "train",
        f"{target}:Classifier",
        "--data",
        str(tmp_path / "train.jsonl"),
        "--resources",
        str(tmp_path / "resources.yaml"),
        "--out",
        str(tmp_path / "out"),
        "-q",
        *extra,
    ]


# -- point 10: the data files are part of a training run's identity -----------------------------
@pytest.mark.parametrize("changed", ["--val", "--test"])
def test_resuming_with_other_data_files_is_refused_naming_what_changed(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], changed: str
) -> None:
    from plait.cli import main as cli_main

    sets = {"--val": "val.jsonl", "--test": "test.jsonl"}
    first = command(tmp_path, server.base_url, "--max-steps", "1")
    for flag, name in sets.items():
        first += [flag, str(tmp_path / name)]
    with mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True):
        assert cli_main(first) == 0
        capsys.readouterr()
        again = command(tmp_path, server.base_url)
        for flag, name in sets.items():
            again += [flag, str(tmp_path / ("other.jsonl" if flag == changed else name))]
        assert cli_main(again) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"({changed})" in err and "changed" in err
    other = "--test" if changed == "--val" else "--val"
    assert f"({other})" not in err


@pytest.mark.parametrize(
    ("before", "after", "named"),
    [
        (["--loss", "exact"], ["--loss", "contains"], "was ExactMatch, now Contains"),
        (
            ["--loss", "judge", "--criteria", "correct label"],
            ["--loss", "judge", "--criteria", "polite"],
            'criteria was ["correct label"], now ["polite"]',
        ),
        (
            ["--loss", "judge", "--criteria", "correct label"],
            ["--loss", "judge", "--criteria", "correct label", "--judge-alias", "fast"],
            'alias was "optimizer", now "fast"',
        ),
    ],
)
def test_resuming_with_another_loss_is_refused_naming_what_changed(
    server: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    before: list[str],
    after: list[str],
    named: str,
) -> None:
    """A resumed run compares its validation scores with the best the checkpoint kept:
    under another loss (or the same judge grading by other criteria) that comparison,
    and the before/after report, would mean nothing."""
    from plait.cli import main as cli_main

    judge = {"score": 10, "feedback": "fine"}
    val = ["--val", str(tmp_path / "val.jsonl"), "--judge-alias", "optimizer"]
    first = command(tmp_path, server.base_url, *val, *before, "--max-steps", "1")
    answers = {"fast": classify, "rewriter": "Answer GOOD.", "optimizer": judge}
    with mock(answers, strict=False):
        assert cli_main(first) == 0, capsys.readouterr().err
        capsys.readouterr()
        again = command(tmp_path, server.base_url, *val, *after, "--max-steps", "2")
        if "--judge-alias" in after:
            again.remove("optimizer")
            again.remove("--judge-alias")
        assert cli_main(again) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "another loss" in err and named in err, err


@pytest.mark.parametrize("change", ["setting", "code"])
def test_resuming_with_another_pipeline_is_refused_naming_what_changed(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], change: str
) -> None:
    """The steps a checkpoint kept were measured on the pipeline as it was: an edited
    forward, or a call's settings changed on the command line, would be trained on
    from scores of another pipeline."""
    from plait.cli import main as cli_main

    val = ["--val", str(tmp_path / "val.jsonl")]
    with mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True):
        assert cli_main(command(tmp_path, server.base_url, *val, "--max-steps", "1")) == 0
        capsys.readouterr()
        again = command(tmp_path, server.base_url, *val, "--max-steps", "2")
        if change == "setting":
            again.insert(2, "llm.temperature=0.3")
        else:
            pipeline = tmp_path / "pipeline.py"
            pipeline.write_text(
                pipeline.read_text().replace("self.llm(text)", "self.llm(text.strip())")
            )
        assert cli_main(again) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    named = "the settings of llm" if change == "setting" else "the pipeline's code"
    assert "another pipeline" in err and named in err, err


def test_resuming_on_another_model_is_refused_naming_the_alias(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The best validation score the checkpoint kept was the old model's: a resumed run
    on another model would keep or roll back updates by comparing the two."""
    from plait.cli import main as cli_main

    val = ["--val", str(tmp_path / "val.jsonl")]
    with mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True):
        assert cli_main(command(tmp_path, server.base_url, *val, "--max-steps", "1")) == 0
        capsys.readouterr()
        config = json.loads((tmp_path / "resources.yaml").read_text(encoding="utf-8"))
        config["fast"] = {**config["fast"], "model": "a-bigger-model"}
        (tmp_path / "resources.yaml").write_text(json.dumps(config), encoding="utf-8")
        assert cli_main(command(tmp_path, server.base_url, *val, "--max-steps", "2")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "alias 'fast' was openai/m, now openai/a-bigger-model" in err, err


# -- point 16: failures while training are one-line errors ---------------------------------------
@pytest.mark.parametrize("failure", ["endpoint down", "401"])
def test_a_failing_validation_call_is_one_line_naming_the_alias_and_cause(
    server: Any, tmp_path: Path, failure: str, refused_port: int
) -> None:
    import subprocess
    import sys

    base_url = server.base_url
    argv = command(tmp_path, base_url, "--val", str(tmp_path / "val.jsonl"))
    config = (tmp_path / "resources.yaml").read_text(encoding="utf-8")
    if failure == "endpoint down":
        config = config.replace(base_url, f"http://127.0.0.1:{refused_port}/v1")
        config = config.replace('"openai"', '"openai", "max_retries": 0')
    else:
        config = config.replace("sk-test", "sk-wrong")
    (tmp_path / "resources.yaml").write_text(config, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "plait.cli", *argv],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    err = done.stderr.strip()
    assert "Traceback" not in err and "ExecutionError" not in err
    assert len(err.splitlines()) == 1, err
    assert "alias 'fast'" in err and "llm" in err
    assert ("401" in err) if failure == "401" else ("connect" in err.lower())
    assert "sk-wrong" not in err


def test_resuming_with_the_optimizers_in_another_order_is_refused(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from plait.cli import main as cli_main

    val = ["--val", str(tmp_path / "val.jsonl")]
    order = ["--optimizer", "sfa", "--optimizer", "bootstrap"]
    reverse = ["--optimizer", "bootstrap", "--optimizer", "sfa"]
    with mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True):
        assert cli_main(command(tmp_path, server.base_url, *val, *order, "--max-steps", "1")) == 0
        capsys.readouterr()
        assert cli_main(command(tmp_path, server.base_url, *val, *reverse)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "same order" in err and "SFAOptimizer, BootstrapFewShot" in err


GATED = """
import asyncio
import sys

import plait


class Gate(plait.Module):
    async def forward(self, text: str) -> str:
        if "stop here" in text:
            print("GATE", file=sys.stderr, flush=True)
            await asyncio.Event().wait()  # until the run is interrupted
        return text


class Classifier(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()
        self.llm = plait.LLMInference(
            "fast", system_prompt=plait.Parameter("Label it.", description="Labelling.")
        )

    def forward(self, text: str):
        return self.llm(self.gate(text))
"""


def test_ctrl_c_prints_the_exact_command_that_resumes(server: Any, tmp_path: Path) -> None:
    import shlex
    import signal
    import subprocess
    import sys

    argv = command(tmp_path, server.base_url, "--fresh")
    (tmp_path / "pipeline.py").write_text(GATED, encoding="utf-8")
    write_rows(tmp_path / "train.jsonl", [*dataset(3), ("stop here", "positive")])
    proc = subprocess.Popen(
        [sys.executable, "-m", "plait.cli", *argv],
        cwd=Path(__file__).resolve().parent.parent,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # wait for the run to reach the gate: it can go no further
            seen.append(line)
            if line.strip() == "GATE":
                break
        assert seen and seen[-1].strip() == "GATE", "".join(seen)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest
    assert "Traceback" not in rest
    hint = next(line for line in rest.splitlines() if "To resume, run: " in line)
    resume = shlex.split(hint.split("To resume, run: ", 1)[1])
    assert resume == ["plait", *[arg for arg in argv if arg != "--fresh"]]


# -- point 5: a killed step's completed calls are not paid again ----------------------------------
def _logged_calls(directory: Path) -> int:
    """Call records in the trainer's call logs under ``directory`` (whole lines only)."""
    total = 0
    for log in directory.glob("calls-*/log.jsonl"):
        data = log.read_bytes()
        total += sum(1 for line in data.split(b"\n")[:-1] if b'"t":"call"' in line)
    return total


def _wait_logged(directory: Path, count: int, proc: Any) -> int:
    """Return once ``count`` calls are in the log (a state, polled as `wait_parked` polls)."""
    import time

    deadline = time.monotonic() + 120
    while (seen := _logged_calls(directory)) < count:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"only {seen} of {count} calls were logged"
        time.sleep(0.01)
    return seen


def test_a_step_killed_mid_way_pays_only_for_the_calls_it_had_not_completed(
    server: Any, tmp_path: Path
) -> None:
    """Invariant: a call whose reply was logged before the kill is never paid again;
    only calls in flight at the kill are paid twice, and the resumed run ends with the
    parameters and the scores of an uninterrupted one."""
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    gate = "trainkill"
    train_rows = [*dataset(3), (f"a good thing [[gate:{gate}]]", "positive")]

    def run(directory: Path, *, background: bool = False) -> Any:
        directory.mkdir(exist_ok=True)
        argv = command(directory, server.base_url, "--val", str(directory / "val.jsonl"))
        write_rows(directory / "train.jsonl", train_rows)
        full = [sys.executable, "-m", "plait.cli", *argv, "--batch-size", "4"]
        if background:
            return subprocess.Popen(
                full, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        return subprocess.run(full, cwd=root, capture_output=True, text=True, timeout=120)

    # The killed run: the initial validation (4 calls) and three of the minibatch's four
    # calls complete; the fourth waits at the gate, in flight, when the process dies.
    server.close_gate(gate)
    killed_dir = tmp_path / "killed"
    proc = run(killed_dir, background=True)
    try:
        server.wait_parked(gate, 1)
        logged = _wait_logged(killed_dir / "out" / "checkpoint", 4 + 3, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert logged == 7
    first_paid = server.stats()["requests_total"]
    assert first_paid == 4 + 4  # the three logged and the one in flight

    server.reset()  # (which closes every gate)
    server.open_gate(gate)
    resumed = run(killed_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    second_paid = server.stats()["requests_total"]

    server.reset()
    server.open_gate(gate)
    whole_dir = tmp_path / "whole"
    whole = run(whole_dir)
    assert whole.returncode == 0, whole.stderr
    uninterrupted = server.stats()["requests_total"]

    # Only the call in flight at the kill was paid twice.
    assert first_paid + second_paid == uninterrupted + 1
    for name in ("parameters.json", "history.json"):
        got = json.loads((killed_dir / "out" / name).read_text(encoding="utf-8"))
        want = json.loads((whole_dir / "out" / name).read_text(encoding="utf-8"))
        if name == "history.json":  # what each process spent differs, by design
            # The resumed run's account is what both processes sent: every request once.
            assert got["spend"]["total"]["requests"] == first_paid + second_paid
            assert want["spend"]["total"]["requests"] == uninterrupted
            for record in (*got["steps"], *want["steps"]):
                del record["calls"], record["tokens"], record["spend"]
                for trial in record["trials"]:
                    del trial["spend"]
            del got["spend"], want["spend"]
        assert got == want, name
    # A finished run leaves no call log behind.
    assert not list((killed_dir / "out" / "checkpoint").glob("calls-*"))


def test_bootstrap_on_workers_pays_for_each_minibatch_once(
    server: Any, ray_cluster: Any, tmp_path: Path
) -> None:
    """The workers send back the runs they paid for; bootstrap learns from those
    instead of running the minibatch again in the driver."""
    pytest.importorskip("ray")
    import subprocess
    import sys

    def train(out: str, *extra: str) -> tuple[int, dict[str, Any]]:
        server.reset()
        argv = command(tmp_path, server.base_url, "--val", str(tmp_path / "val.jsonl"))
        argv += ["--optimizer", "bootstrap", "--batch-size", "2", "--out", str(tmp_path / out)]
        done = subprocess.run(
            [sys.executable, "-m", "plait.cli", *argv, *extra],
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        results = {
            name: json.loads((tmp_path / out / name).read_text(encoding="utf-8"))
            for name in ("history.json", "parameters.json")
        }
        return server.stats()["requests_total"], results

    alone_paid, alone = train("alone")
    address = ray_cluster.get_runtime_context().gcs_address
    workers_paid, on_workers = train("workers", "--workers", "2", "--ray-address", address)
    assert workers_paid == alone_paid
    assert on_workers == alone
    # Bootstrap did learn from the runs: each step scored demonstration sets.
    steps = alone["history.json"]["steps"]
    assert steps and all(step["trials"][0]["candidates"] for step in steps)


def test_a_training_run_whose_checkpoint_is_in_use_is_a_one_line_error(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from plait._locks import hold
    from plait.cli import main as cli_main

    argv = command(tmp_path, server.base_url)
    held = tmp_path / "out" / "checkpoint" / "calls-0"
    held.mkdir(parents=True)
    lock = hold(held / "lock")  # as another `plait train` on the same checkpoint holds it
    try:
        with mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True):
            assert cli_main(argv) == 2
    finally:
        import os

        os.close(lock)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "in use by" in err


@pytest.mark.parametrize("workers", [None, 2])
def test_a_step_that_failed_mid_way_resumes_without_paying_its_completed_calls_again(
    server: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    workers: int | None,
    refused_port: int,
) -> None:
    """The minibatch's calls (made here, or on Ray workers) complete, then the rewrite's
    endpoint is down: the step stops.  Once it is back, the resumed step pays only for
    what it had not completed: together, exactly what an uninterrupted run pays."""
    if workers is not None:
        request.getfixturevalue("ray_cluster")
    from tests.test_trainer_workers import TRAIN, VAL, Answerer

    def trainer(directory: Path, rewriter_url: str) -> Trainer:
        model = Answerer()
        optimizer = SFAOptimizer(model.parameters(), alias="smart", check=False, structured=False)
        endpoint = {"provider": "openai", "model": "m", "api_key": "sk-test", "max_retries": 0}
        config = plait.ResourceConfig(
            {
                "fast": {**endpoint, "base_url": server.base_url},
                "smart": {**endpoint, "base_url": rewriter_url},
            }
        )
        return Trainer(
            model, Contains(), optimizer, TRAIN, VAL, resources=config, batch_size=4,
            shuffle=False, checkpoint_dir=directory, workers=workers,
        )  # fmt: skip

    down = f"http://127.0.0.1:{refused_port}/v1"
    with pytest.raises(Exception, match=r"smart|rewrite|connect"):
        trainer(tmp_path / "failed", down).fit_sync()
    first_paid = server.stats()["requests_total"]
    assert first_paid == len(VAL) + 4  # the initial validation and the minibatch

    server.reset()
    resumed = trainer(tmp_path / "failed", server.base_url)
    assert resumed.resumed
    history = resumed.fit_sync()
    second_paid = server.stats()["requests_total"]

    server.reset()
    whole = trainer(tmp_path / "whole", server.base_url)
    expected = whole.fit_sync()
    uninterrupted = server.stats()["requests_total"]

    assert first_paid + second_paid == uninterrupted
    assert resumed.model.state_dict() == whole.model.state_dict()
    assert [r.val_score for r in history.steps] == [r.val_score for r in expected.steps]


def test_fresh_deletes_a_checkpoint_that_holds_only_a_call_log(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed during its initial validation leaves a call log and no step yet."""
    from plait.cli import main as cli_main
    from plait.execution.checkpoint import Checkpoint

    argv = command(tmp_path, server.base_url, "--fresh", "--max-steps", "1")
    argv += ["--val", str(tmp_path / "val.jsonl")]
    log = tmp_path / "out" / "checkpoint" / "calls-0"
    Checkpoint(log, "plait.learning.step.TrainingStep").open().close()
    with mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True):
        assert cli_main(argv) == 0, capsys.readouterr().err


class DemoAnswerer(plait.Module):
    """One LLM call with learnable instructions and demonstrations (for bootstrap)."""

    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter("Answer.", description="How to answer."),
            demos=[],
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


@pytest.mark.parametrize("workers", [None, 2])
def test_a_step_stopped_after_validating_an_update_resumes_without_paying_that_validation(
    server: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    workers: int | None,
    refused_port: int,
) -> None:
    """Bootstrap's demonstration sets are validated (on Ray workers, or here), then the
    second optimizer's endpoint is down and the step stops.  The resumed step skips the
    initial validation the checkpoint holds, so its passes come earlier in the step
    than they did in the stopped run: each still finds the calls it completed, and
    together the two runs pay exactly what an uninterrupted run pays."""
    if workers is not None:
        request.getfixturevalue("ray_cluster")
    from plait.learning.bootstrap import BootstrapFewShot
    from tests.test_trainer_workers import TRAIN, VAL

    def trainer(directory: Path, second_url: str) -> Trainer:
        model = DemoAnswerer()
        first = BootstrapFewShot(model.parameters(), max_demos=2, candidates=2)
        second = SFAOptimizer(model.parameters(), alias="smart2", check=False, structured=False)
        endpoint = {"provider": "openai", "model": "m", "api_key": "sk-test", "max_retries": 0}
        config = plait.ResourceConfig(
            {
                "fast": {**endpoint, "base_url": server.base_url},
                "smart2": {**endpoint, "base_url": second_url},
            }
        )
        return Trainer(
            model, Contains(), [first, second], TRAIN, VAL, resources=config, batch_size=4,
            shuffle=False, checkpoint_dir=directory, workers=workers,
        )  # fmt: skip

    down = f"http://127.0.0.1:{refused_port}/v1"
    with pytest.raises(Exception, match=r"smart2|rewrite|connect"):
        trainer(tmp_path / "failed", down).fit_sync()
    first_paid = server.stats()["requests_total"]
    # The initial validation, the minibatch and bootstrap's candidates' validations.
    assert first_paid >= len(VAL) + 4 + 2 * len(VAL)

    server.reset()
    resumed = trainer(tmp_path / "failed", server.base_url)
    assert resumed.resumed
    history = resumed.fit_sync()
    second_paid = server.stats()["requests_total"]

    server.reset()
    whole = trainer(tmp_path / "whole", server.base_url)
    expected = whole.fit_sync()
    uninterrupted = server.stats()["requests_total"]

    assert first_paid + second_paid == uninterrupted
    assert resumed.model.state_dict() == whole.model.state_dict()
    assert [r.val_score for r in history.steps] == [r.val_score for r in expected.steps]


def _train_cli(argv: list[str]) -> Any:
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "plait.cli", *argv],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("failing", ["minibatch", "optimizer", "teacher", "judge"])
def test_a_failing_call_anywhere_in_training_is_one_line_naming_the_alias_and_cause(
    server: Any, tmp_path: Path, failing: str
) -> None:
    """No --val: the minibatch's own calls (not validation's), a rewrite, a bootstrap
    teacher's run: each failure is one line naming the alias and the cause, exit 1."""
    argv = command(tmp_path, server.base_url)
    config = json.loads((tmp_path / "resources.yaml").read_text(encoding="utf-8"))
    config["teacher"] = dict(config["fast"])
    config["judge"] = dict(config["fast"])
    alias = {"minibatch": "fast", "optimizer": "optimizer", "teacher": "teacher"}.get(
        failing, failing
    )
    config[alias] = {**config[alias], "api_key": "sk-wrong"}
    (tmp_path / "resources.yaml").write_text(json.dumps(config), encoding="utf-8")
    if failing == "teacher":
        argv += ["--optimizer", "bootstrap", "--teacher-alias", "teacher"]
    if failing == "judge":  # the loss's own call: a judge grading each output
        argv += ["--loss", "judge", "--criteria", "right label", "--judge-alias", "judge"]
    done = _train_cli(argv)
    assert done.returncode == 1, done.stderr
    err = done.stderr.strip()
    assert "Traceback" not in err and "Error:" not in err.split(": error: ")[0]
    assert len(err.splitlines()) == 1, err
    assert f"alias {alias!r}" in err and "401" in err, err
    assert "sk-wrong" not in err


@pytest.mark.parametrize("missing", ["optimizer", "teacher"])
def test_an_alias_the_run_needs_and_the_resources_lack_is_refused_before_any_call(
    server: Any, tmp_path: Path, missing: str
) -> None:
    argv = command(tmp_path, server.base_url, "--val", str(tmp_path / "val.jsonl"))
    config = json.loads((tmp_path / "resources.yaml").read_text(encoding="utf-8"))
    if missing == "optimizer":
        del config["optimizer"]
    else:
        argv += ["--optimizer", "bootstrap", "--teacher-alias", "teacher"]
    (tmp_path / "resources.yaml").write_text(json.dumps(config), encoding="utf-8")
    done = _train_cli(argv)
    assert done.returncode == 2, done.stderr
    err = done.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert f"'{missing}'" in err and "resources" in err, err
    assert server.stats()["requests_total"] == 0


def test_a_step_killed_after_its_worker_passes_pays_only_for_the_call_in_flight(
    server: Any, ray_cluster: Any, tmp_path: Path
) -> None:
    """``--workers 2``, bootstrap then sfa: the initial validation, the minibatch and
    bootstrap's candidate validations run on the Ray workers, all at the first
    position; the process is killed while the rewrite that follows waits at the gate.
    The resumed step (which skips the initial validation the checkpoint holds) is
    answered every call the workers logged: only the rewrite in flight is paid twice."""
    pytest.importorskip("ray")
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    address = ray_cluster.get_runtime_context().gcs_address
    gate = "rewrite"
    # Only the rewrite's prompt carries the parameter's description.
    server.configure(gate_texts={"Labelling.": gate})

    def run(directory: Path, *, background: bool = False) -> Any:
        directory.mkdir(exist_ok=True)
        argv = command(directory, server.base_url, "--val", str(directory / "val.jsonl"))
        argv += ["--optimizer", "bootstrap", "--optimizer", "sfa", "--candidates", "2"]
        full = [sys.executable, "-m", "plait.cli", *argv, "--max-steps", "1", "--workers", "2"]
        full += ["--ray-address", address]  # the session's Ray: the driver alone is killed
        if background:
            return subprocess.Popen(
                full, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True,
            )  # fmt: skip
        return subprocess.run(full, cwd=root, capture_output=True, text=True, timeout=300)

    server.close_gate(gate)
    killed_dir = tmp_path / "killed"
    proc = run(killed_dir, background=True)
    try:
        server.wait_parked(gate, 1, timeout=240)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    first_paid = server.stats()["requests_total"]

    server.reset()  # (which closes every gate)
    server.configure(gate_texts={"Labelling.": gate})
    server.open_gate(gate)
    resumed = run(killed_dir)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    second_paid = server.stats()["requests_total"]

    server.reset()
    server.configure(gate_texts={"Labelling.": gate})
    server.open_gate(gate)
    whole_dir = tmp_path / "whole"
    whole = run(whole_dir)
    assert whole.returncode == 0, whole.stderr
    uninterrupted = server.stats()["requests_total"]

    # Only the rewrite in flight at the kill was paid twice.
    assert first_paid + second_paid == uninterrupted + 1
    got = json.loads((killed_dir / "out" / "parameters.json").read_text(encoding="utf-8"))
    want = json.loads((whole_dir / "out" / "parameters.json").read_text(encoding="utf-8"))
    assert got == want
