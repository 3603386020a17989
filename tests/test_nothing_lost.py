"""No input vanishes (issue 11): outputs a checkpoint cannot store, locally defined
structured-output classes, lone surrogates; and checkpoints hold data, never code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pydantic
import pytest

import plait
from plait.execution.codec import decode, encode
from plait.testing import FakeOpenAIServer

from .conftest import plait_cli

ROOT = Path(__file__).resolve().parent.parent


class Odd(plait.Module):
    """Returns, for the input "odd", an object with no JSON form."""

    async def forward(self, text: str) -> Any:
        return {1, 2} if text == "odd" else text.upper()


@pytest.mark.parametrize("batch", [True, False])
def test_an_output_a_checkpoint_cannot_store_is_still_delivered(
    tmp_path: Path, batch: bool
) -> None:
    pipeline = Odd().bind(checkpoint_dir=tmp_path / "ckpt")
    if batch:
        assert pipeline.run_sync(["a", "odd", "b"]) == ["A", {1, 2}, "B"]
        again = pipeline.run_sync(["a", "odd", "b"])  # resumed: the odd one runs again
        assert again == ["A", {1, 2}, "B"]
    else:
        assert pipeline.run_sync("odd") == {1, 2}
    lines = (tmp_path / "ckpt" / "log.jsonl").read_text().splitlines()
    stored = sorted(json.loads(line)["v"] for line in lines if json.loads(line)["t"] == "out")
    assert stored == (["A", "B"] if batch else [])  # the set is delivered, not stored
    assert "pickle" not in "".join(lines)


def _resources(tmp_path: Path, server: FakeOpenAIServer) -> Path:
    path = tmp_path / "resources.toml"
    path.write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    return path


def test_structured_output_with_a_locally_defined_class_is_written_and_resumed(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target = tmp_path / "local_target.py"
    target.write_text(
        textwrap.dedent(
            """
            import pydantic
            import plait

            class Labeller(plait.Module):
                def __init__(self) -> None:
                    super().__init__()

                    class Verdict(pydantic.BaseModel):  # defined inside a function
                        label: str

                    self.llm = plait.LLMInference("fast", response_format=Verdict)

                def forward(self, text: str):
                    return self.llm(text)
            """
        )
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(f"text {i}") + "\n" for i in range(3)))
    out = tmp_path / "out.jsonl"
    res = _resources(tmp_path, server)
    first = plait_cli("run", f"{target}:Labeller", "-i", inputs, "-o", out, "--resources", res)
    assert first.returncode == 0, first.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["index"] for row in rows) == [0, 1, 2]
    assert all(set(row["output"]) == {"label"} for row in rows)
    assert "3 succeeded, 0 failed" in first.stderr
    paid = server.stats()["requests_total"]
    assert paid == 3
    again = plait_cli("run", f"{target}:Labeller", "-i", inputs, "-o", out, "--resources", res)
    assert again.returncode == 0, again.stderr
    assert server.stats()["requests_total"] == paid  # resumed: nothing paid twice
    assert sorted(json.loads(line)["index"] for line in out.read_text().splitlines()) == [0, 1, 2]


def test_every_input_is_a_row_and_the_summary_counts_the_rows(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target = tmp_path / "odd_target.py"
    target.write_text(
        "import plait\n"
        "class Odd(plait.Module):\n"
        "    async def forward(self, text: str):\n"
        "        return (lambda: 0) if text == 'odd' else text.upper()\n"
    )
    inputs = tmp_path / "in.jsonl"
    texts = ["a", "odd", "b", "bad \ud800 text"]
    inputs.write_text("".join(json.dumps(t) + "\n" for t in texts))
    for order in ([], ["--preserve-order"]):
        out = tmp_path / f"out{len(order)}.jsonl"
        done = plait_cli("run", f"{target}:Odd", "-i", inputs, "-o", out, *order)
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert sorted(row["index"] for row in rows) == [0, 1, 2, 3], done.stderr
        # a function is code, not an output: that input's error row, naming the type
        assert "4 input(s): 3 succeeded, 1 failed" in done.stderr
        assert done.returncode == 1
        odd = next(row for row in rows if row["index"] == 1)
        assert odd["error"]["type"] == "UnwritableOutput" and "output" not in odd
        assert "it holds a function" in odd["error"]["message"]
        assert {row["index"]: row["output"] for row in rows if row["index"] != 1} == {
            0: "A",
            2: "B",
            3: "BAD \ud800 TEXT",
        }


class Verdict(pydantic.BaseModel):
    label: str


def test_checkpoints_hold_data_and_never_import_or_unpickle() -> None:
    stored = encode({"v": Verdict(label="x"), "t": (1, "a")})
    assert json.loads(json.dumps(stored)) == stored  # plain JSON
    assert decode(stored) == {"v": Verdict(label="x"), "t": (1, "a")}
    # a class whose module is not loaded is never imported: its data comes back as data
    foreign = {"$model": "some_module_never_imported:Evil", "data": {"x": 1}}
    assert decode(foreign) == {"x": 1}
    assert "some_module_never_imported" not in sys.modules
    with pytest.raises(ValueError, match="no longer unpickles"):
        decode({"$pickle": "gASVAAAAAAAAAAA="})
    with pytest.raises(TypeError, match="no JSON form"):
        encode(object())


def test_a_local_class_comes_back_as_its_data() -> None:
    class Inner(pydantic.BaseModel):
        n: int

    assert decode(encode(Inner(n=3))) == {"n": 3}


def test_an_output_the_writer_cannot_serialise_is_that_inputs_error_row(
    tmp_path: Path,
) -> None:
    target = tmp_path / "unwritable_target.py"
    target.write_text(
        textwrap.dedent(
            """
            from typing import Any
            import pydantic, plait

            class Arb(pydantic.BaseModel):
                model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
                f: Any

            class BadStr:
                def __str__(self):
                    raise RuntimeError("str refused")
                def __repr__(self):
                    raise RuntimeError("repr refused")

            class Odd(plait.Module):
                async def forward(self, text: str):
                    if text == "arb":
                        return Arb(f=lambda: 1)
                    if text == "badstr":
                        return BadStr()
                    return text.upper()
            """
        )
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(t) + "\n" for t in ["a", "arb", "badstr", "b"]))
    for order in ([], ["--preserve-order"]):
        out = tmp_path / f"out{len(order)}.jsonl"
        for _ in range(2):  # and again, resumed from the checkpoint
            done = plait_cli("run", f"{target}:Odd", "-i", inputs, "-o", out, *order)
            assert "Traceback" not in done.stderr, done.stderr
            rows = {row["index"]: row for row in map(json.loads, out.read_text().splitlines())}
            assert sorted(rows) == [0, 1, 2, 3]
            assert rows[0]["output"] == "A" and rows[3]["output"] == "B"
            for bad in (1, 2):
                assert rows[bad]["error"]["type"] == "UnwritableOutput"
                assert "has no JSON form" in rows[bad]["error"]["message"]
            assert "4 input(s): 2 succeeded, 2 failed" in done.stderr
            assert done.returncode == 1


def test_a_cyclic_output_is_delivered_and_not_stored_by_the_checkpoint(tmp_path: Path) -> None:
    class Cycle(plait.Module):
        async def forward(self, text: str) -> Any:
            looped: list[Any] = [text]
            looped.append(looped)
            return looped

    out = Cycle().bind(checkpoint_dir=tmp_path / "ckpt").run_sync("x")
    assert out[0] == "x" and out[1] is out
    batch = Cycle().bind(checkpoint_dir=tmp_path / "ckpt2").run_sync(["x", "y"])
    assert [o[0] for o in batch] == ["x", "y"]
    lines = (tmp_path / "ckpt2" / "log.jsonl").read_text().splitlines()
    assert not [line for line in lines if json.loads(line)["t"] == "out"]


_EXITS = """
import asyncio, sys, plait

class Exits(plait.Module):
    async def forward(self, text: str):
        if text == "exit":
            sys.exit(3)
        if text == "cancel":
            raise asyncio.CancelledError()
        return text.upper()

class SyncExits(plait.Module):
    def forward(self, text: str):
        if text == "exit":
            sys.exit("bye")
        return text
"""


def test_sys_exit_or_cancelled_error_in_forward_fails_that_input_and_never_hangs(
    tmp_path: Path,
) -> None:
    target = tmp_path / "exits_target.py"
    target.write_text(_EXITS)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps(t) + "\n" for t in ["a", "exit", "cancel", "b"]))
    out = tmp_path / "out.jsonl"
    done = plait_cli("run", f"{target}:Exits", "-i", inputs, "-o", out)  # timeout: a hang fails
    rows = {row["index"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2, 3], done.stderr
    assert rows[0]["output"] == "A" and rows[3]["output"] == "B"
    assert "forward raised SystemExit: 3" in rows[1]["error"]["message"]
    assert "forward raised CancelledError" in rows[2]["error"]["message"]
    assert "4 input(s): 2 succeeded, 2 failed" in done.stderr and done.returncode == 1
    script = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import plait, exits_target as t\n"
        "for cls in (t.Exits, t.SyncExits):\n"
        "    for ck in (None, sys.argv[1] + cls.__name__):\n"
        "        out = cls().bind(checkpoint_dir=ck).run_sync(['a', 'exit', 'cancel'])\n"
        "        V = plait.Value\n"
        "        print([o.meta['message'].split(' (')[0] if isinstance(o, V) else o for o in out])\n"  # noqa: E501
        "        try:\n"
        "            cls().run_sync('exit')\n"
        "        except plait.ExecutionError as exc:\n"
        "            print('raised', str(exc).split(' (')[0])\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "ck")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "['A', 'forward raised SystemExit: 3', 'forward raised CancelledError']"
    assert lines[1] == "raised Exits failed: ForwardAborted: forward raised SystemExit: 3"
    assert lines[6] == "['a', 'forward raised SystemExit: bye', 'cancel']"
    assert len(lines) == 8


def test_a_dict_whose_keys_collide_as_text_keeps_every_value_in_its_row(tmp_path: Path) -> None:
    target = tmp_path / "keys_target.py"
    target.write_text(
        "import plait\n"
        "class Keys(plait.Module):\n"
        "    async def forward(self, text: str):\n"
        "        if text == 'collide':\n"
        "            return {'outer': {1: 'a', '1': 'b'}, 'ok': {2: 'c'}}\n"
        "        return {True: 'x', 'true': 'y'}\n"
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"collide"\n"bool"\n')
    out = tmp_path / "out.jsonl"
    for _ in range(2):  # and again, resumed from the checkpoint
        done = plait_cli("run", f"{target}:Keys", "-i", inputs, "-o", out)
        assert done.returncode == 0, done.stderr
        lines = out.read_text().splitlines()
        rows = {row["index"]: row["output"] for row in map(json.loads, lines)}
        assert rows[0] == {"outer": {"$dict": [[1, "a"], ["1", "b"]]}, "ok": {"2": "c"}}
        assert rows[1] == {"$dict": [[True, "x"], ["true", "y"]]}
