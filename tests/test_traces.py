"""Trace readers: the real Mooncake and Azure traces, error messages, native round trip."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from longroute.types import SLO, Language
from longroute.workloads.generators import long_sessions, mixed_long_short, short_chat
from longroute.workloads.traces import (
    TraceError,
    load_trace,
    read_azure_csv,
    read_mooncake,
    read_native_jsonl,
    write_native_jsonl,
)
from longroute.workloads.types import Session, Turn, Workload

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
MOONCAKE = TRACES / "mooncake_synthetic_trace.jsonl"
AZURE = TRACES / "azure_llm_inference_2023_conv.csv"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
needs_mooncake = pytest.mark.skipif(
    not MOONCAKE.exists(),
    reason=f"needs the full Mooncake trace at {MOONCAKE} (not in a clone; the package bundles "
    "a 500-request excerpt, tested below)",
)
needs_azure = pytest.mark.skipif(
    not AZURE.exists(),
    reason=f"needs the full Azure trace at {AZURE} (not in a clone; the package bundles a "
    "3,000-request excerpt, tested below)",
)


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _mooncake_line(**fields: object) -> str:
    obj: dict[str, object] = {
        "timestamp": 0,
        "input_length": 1100,
        "output_length": 5,
        "hash_ids": [1, 2, 3],
    }
    obj.update(fields)
    return json.dumps(obj)


# --- real traces --------------------------------------------------------------------------


@needs_mooncake
def test_mooncake_trace_loads_fast_with_the_published_statistics() -> None:
    started = time.perf_counter()
    workload = read_mooncake(MOONCAKE)
    elapsed_s = time.perf_counter() - started
    assert elapsed_s < 1.0
    assert workload.num_requests == len(workload.sessions) == 3993
    assert workload.block_size_tokens == 512
    assert workload.is_timed
    prompts = [s.turns[0].num_prompt_tokens for s in workload.sessions]
    assert sum(prompts) / len(prompts) == pytest.approx(15325.48, abs=0.01)
    starts = [s.start_s or 0.0 for s in workload.sessions]
    assert starts[0] == 0.0 and starts == sorted(starts)
    assert starts[-1] == pytest.approx(1022.025)
    for session in workload.sessions:
        turn = session.turns[0]
        assert len(turn.block_hashes) == turn.num_prompt_tokens // 512
        assert turn.num_output_tokens >= 1
    # Mooncake ids are shared prefixes: some requests reuse others' first blocks.
    first_ids = [s.turns[0].block_hashes[0] for s in workload.sessions if s.turns[0].block_hashes]
    assert len(set(first_ids)) < len(first_ids)


@needs_azure
def test_azure_trace_loads_with_arrivals_from_zero() -> None:
    started = time.perf_counter()
    workload = load_trace(AZURE)
    assert time.perf_counter() - started < 2.0
    # The file has 19,366 data rows (19,367 lines with the header; the last has no newline).
    assert workload.num_requests == 19366
    assert workload.is_timed
    starts = [s.start_s or 0.0 for s in workload.sessions]
    assert starts[0] == 0.0 and starts == sorted(starts)
    assert starts[-1] == pytest.approx(3501.721937)
    assert starts[1] == pytest.approx(4.314579)  # 18:15:50.9951690 - 18:15:46.6805900
    prompts = [s.turns[0].num_prompt_tokens for s in workload.sessions]
    assert sum(prompts) / len(prompts) == pytest.approx(1154.70, abs=0.01)
    assert all(s.turns[0].block_hashes == () for s in workload.sessions)


@needs_mooncake
def test_load_trace_detects_mooncake_and_native(tmp_path: Path) -> None:
    assert load_trace(MOONCAKE) == read_mooncake(MOONCAKE)
    native = tmp_path / "few.jsonl"
    native.write_text('{"prompt_tokens": 10, "output_tokens": 2}\n', encoding="utf-8")
    assert load_trace(native).sessions[0].turns[0] == Turn(10, 2)


# --- Mooncake details and errors ----------------------------------------------------------


def test_mooncake_keeps_only_full_blocks_clamps_zero_outputs_and_sorts(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "m.jsonl",
        [
            _mooncake_line(timestamp=2500, input_length=1100, hash_ids=[1, 2, 3]),
            "",
            _mooncake_line(timestamp=1000.5, input_length=511, output_length=0, hash_ids=[9]),
        ],
    )
    workload = read_mooncake(path)
    assert [s.start_s for s in workload.sessions] == [1.0005, 2.5]
    assert workload.sessions[0].turns[0] == Turn(511, 1, ())
    assert workload.sessions[1].turns[0] == Turn(1100, 5, (1, 2))
    assert workload.sessions[1].session_id == "m-1"


@pytest.mark.parametrize(
    ("bad_line", "field", "fragment"),
    [
        (_mooncake_line(input_length="abc"), "input_length", 'got "abc"'),
        (_mooncake_line(output_length=-1), "output_length", "got -1"),
        (_mooncake_line(timestamp="soon"), "timestamp", 'got "soon"'),
        (_mooncake_line(hash_ids=[1, "x"]), "hash_ids", 'got "x"'),
        (_mooncake_line(input_length=5000), "hash_ids", "at least 9 ids"),
        ('{"timestamp": 0, "output_length": 5, "hash_ids": []}', "input_length", "missing"),
    ],
)
def test_mooncake_errors_name_file_line_and_field(
    tmp_path: Path, bad_line: str, field: str, fragment: str
) -> None:
    path = _write(tmp_path, "broken_trace.jsonl", [_mooncake_line(), _mooncake_line(), bad_line])
    with pytest.raises(TraceError) as info:
        read_mooncake(path)
    message = str(info.value)
    assert "broken_trace.jsonl:3: " in message
    assert f"field {field!r}" in message
    assert fragment in message
    assert info.value.line == 3 and info.value.field == field


def test_invalid_json_and_non_objects_are_reported_with_their_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad.jsonl", [_mooncake_line(), '{"timestamp": 0,'])
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: invalid JSON"):
        read_mooncake(path)
    path = _write(tmp_path, "list.jsonl", ["[1, 2]"])
    with pytest.raises(TraceError, match=r"list\.jsonl:1: expected a JSON object, got \[1, 2\]"):
        load_trace(path, "mooncake")


@pytest.mark.parametrize("reader", [read_mooncake, read_azure_csv, read_native_jsonl, load_trace])
def test_missing_and_empty_files_are_errors(tmp_path: Path, reader: object) -> None:
    assert callable(reader)
    missing = tmp_path / "nowhere" / "trace.jsonl"
    with pytest.raises(TraceError, match=r"nowhere/trace\.jsonl: no such file"):
        reader(missing)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(TraceError, match="empty"):
        reader(empty)


# --- Azure details and errors -------------------------------------------------------------


def test_azure_keeps_the_order_of_seven_digit_fractions(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "a.csv",
        [
            AZURE_HEADER.strip(),
            "2023-11-16 18:15:47.0000002,10,0",
            "2023-11-16 18:15:47.0000001,20,3",
            "2023-11-16 18:15:46,30,4",
            "2023-11-17 00:00:00.5,40,5",
        ],
    )
    workload = read_azure_csv(path)
    prompts = [s.turns[0].num_prompt_tokens for s in workload.sessions]
    assert prompts == [30, 20, 10, 40]
    starts = [s.start_s or 0.0 for s in workload.sessions]
    assert starts[:3] == [0.0, pytest.approx(1.0000001, abs=1e-9), pytest.approx(1.0000002)]
    assert starts[3] == pytest.approx(20654.5)  # crosses midnight
    assert workload.sessions[2].turns[0].num_output_tokens == 1  # 0 generated -> 1


@pytest.mark.parametrize(
    ("bad_row", "field", "fragment"),
    [
        ("2023-11-16 18:15:46.68,abc,3", "ContextTokens", 'got "abc"'),
        ("2023-11-16 18:15:46.68,10,-3", "GeneratedTokens", 'got "-3"'),
        ("yesterday,10,3", "TIMESTAMP", 'got "yesterday"'),
        ("2023-13-16 18:15:46.68,10,3", "TIMESTAMP", "2023-13-16"),
        ("2023-11-16 25:15:46.68,10,3", "TIMESTAMP", "25:15"),
    ],
)
def test_azure_errors_name_file_line_and_field(
    tmp_path: Path, bad_row: str, field: str, fragment: str
) -> None:
    good = "2023-11-16 18:15:46.6805900,374,44"
    path = _write(tmp_path, "conv.csv", [AZURE_HEADER.strip(), good, bad_row])
    with pytest.raises(TraceError) as info:
        read_azure_csv(path)
    message = str(info.value)
    assert "conv.csv:3: " in message and f"field {field!r}" in message and fragment in message


def test_azure_rejects_wrong_header_and_column_count(tmp_path: Path) -> None:
    path = _write(tmp_path, "h.csv", ["time,in,out", "2023-11-16 18:15:46,1,1"])
    with pytest.raises(TraceError, match=r"h\.csv:1: expected the header"):
        read_azure_csv(path)
    path = _write(tmp_path, "c.csv", [AZURE_HEADER.strip(), "2023-11-16 18:15:46,1"])
    with pytest.raises(TraceError, match=r"c\.csv:2: expected 3 comma-separated columns"):
        read_azure_csv(path)
    path = _write(tmp_path, "only_header.csv", [AZURE_HEADER.strip()])
    with pytest.raises(TraceError, match="no requests"):
        read_azure_csv(path)


# --- native format ------------------------------------------------------------------------


def _hand_built_workload(name: str) -> Workload:
    slo = SLO(ttft_s=2.0, e2e_s=30.0)
    first = Turn(1100, 20, (5, 6), 0.0, Language.CJK, "qa", "llama-8b", slo)
    second = Turn(1500, 7, (5, 6), 3.25, Language.LATIN, None, None, SLO(tpot_s=0.05))
    return Workload(
        name,
        (
            Session("chat-a", (first, second), start_s=0.5),
            Session("chat-b", (Turn(10, 1),), start_s=1.75),
        ),
        512,
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda: short_chat(num_sessions=50, seed=1),
        lambda: long_sessions(num_sessions=20, seed=2, block_size_tokens=64),
        lambda: mixed_long_short(num_sessions=50, seed=3, long_fraction=0.2),
        lambda: _hand_built_workload("hand"),
    ],
)
def test_native_round_trip_gives_an_equal_workload(tmp_path: Path, build: object) -> None:
    assert callable(build)
    workload = build()
    path = tmp_path / f"{workload.name}.jsonl"
    write_native_jsonl(workload, path)
    assert read_native_jsonl(path) == workload
    assert load_trace(path) == workload


@needs_mooncake
def test_native_round_trip_of_the_mooncake_trace(tmp_path: Path) -> None:
    workload = read_mooncake(MOONCAKE)
    path = tmp_path / f"{workload.name}.jsonl"
    write_native_jsonl(workload, path)
    assert load_trace(path, "native") == workload


def test_native_minimal_lines_and_session_grouping(tmp_path: Path) -> None:
    lines = [
        '{"session_id": "s1", "arrival_s": 4.0, "prompt_tokens": 100, "output_tokens": 5}',
        '{"session_id": "s1", "think_time_s": 2, "prompt_tokens": 200, "output_tokens": 6}',
        '{"arrival_s": 1.0, "prompt_tokens": 0, "output_tokens": 1, "task": null}',
    ]
    workload = read_native_jsonl(_write(tmp_path, "mini.jsonl", lines))
    assert [s.session_id for s in workload.sessions] == ["mini-3", "s1"]  # sorted by start
    assert workload.sessions[1].turns == (Turn(100, 5), Turn(200, 6, think_time_s=2.0))
    assert workload.block_size_tokens == 512


@pytest.mark.parametrize(
    ("bad_line", "field", "fragment"),
    [
        (
            '{"prompt_tokens": 5, "output_tokens": 1, "promt": 3}',
            "promt",
            "unknown field (did you mean 'prompt_tokens'?)",
        ),
        ('{"output_tokens": 1}', "prompt_tokens", "missing"),
        ('{"prompt_tokens": 5, "output_tokens": 0}', "output_tokens", "integer >= 1, got 0"),
        ('{"prompt_tokens": -5, "output_tokens": 1}', "prompt_tokens", "got -5"),
        ('{"prompt_tokens": 5, "output_tokens": 1, "arrival_s": -1}', "arrival_s", "got -1"),
        ('{"prompt_tokens": 5, "output_tokens": 1, "language": "klingon"}', "language", "cjk"),
        ('{"prompt_tokens": 5, "output_tokens": 1, "slo_ttft_s": 0}', "slo_ttft_s", "positive"),
        ('{"prompt_tokens": 5, "output_tokens": 1, "session_id": 7}', "session_id", "got 7"),
        (
            '{"prompt_tokens": 600, "output_tokens": 1, "block_hashes": [1, 2], '
            '"block_size_tokens": 512}',
            "block_hashes",
            "at most 1",
        ),
        (
            '{"prompt_tokens": 600, "output_tokens": 1, "block_size_tokens": 256}',
            "block_size_tokens",
            "expected 512 as on line 1",
        ),
        ('{"session_id": "a", "prompt_tokens": 5, "output_tokens": 1}', "session_id", "before"),
        (
            '{"session_id": "b", "prompt_tokens": 5, "output_tokens": 1, "arrival_s": 9}',
            "arrival_s",
            "first line only",
        ),
    ],
)
def test_native_errors_name_file_line_and_field(
    tmp_path: Path, bad_line: str, field: str, fragment: str
) -> None:
    lines = [
        '{"session_id": "a", "prompt_tokens": 600, "output_tokens": 1, "block_size_tokens": 512}',
        '{"session_id": "b", "prompt_tokens": 600, "output_tokens": 1}',
        bad_line,
    ]
    path = _write(tmp_path, "native_trace.jsonl", lines)
    with pytest.raises(TraceError) as info:
        read_native_jsonl(path)
    message = str(info.value)
    assert "native_trace.jsonl:3: " in message
    assert f"field {field!r}" in message
    assert fragment in message


def test_native_hashes_need_a_block_size(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "n.jsonl", ['{"prompt_tokens": 600, "output_tokens": 1, "block_hashes": [1]}']
    )
    with pytest.raises(
        TraceError, match=r"n\.jsonl:1: field 'block_hashes': needs block_size_tokens"
    ):
        read_native_jsonl(path)


def test_writer_rejects_duplicate_session_ids(tmp_path: Path) -> None:
    twice = Workload("dup", (Session("x", (Turn(1, 1),)), Session("x", (Turn(2, 1),))), 16)
    with pytest.raises(ValueError, match="unique"):
        write_native_jsonl(twice, tmp_path / "dup.jsonl")


def test_load_trace_rejects_unknown_formats_and_suffixes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'parquet'.*mooncake, azure, native"):
        load_trace(tmp_path / "x.jsonl", "parquet")
    path = _write(tmp_path, "trace.txt", ["{}"])
    with pytest.raises(
        TraceError, match=r"trace\.txt: cannot tell the trace format.*--trace-format"
    ):
        load_trace(path)
    csv_path = _write(tmp_path, "t.csv", [AZURE_HEADER.strip(), "2023-11-16 18:15:46,7,8"])
    assert load_trace(csv_path).sessions[0].turns[0] == Turn(7, 8)


def test_the_bundled_excerpts_load_by_name() -> None:
    from longroute.workloads.traces import BUILTIN_TRACES, resolve_trace

    mooncake = load_trace("mooncake")
    azure = load_trace("azure-conv")
    assert len(mooncake.sessions) == 500 and mooncake.block_size_tokens == 512
    assert len(azure.sessions) == 3000
    assert all(resolve_trace(name).is_file() for name in BUILTIN_TRACES)
    # the excerpts are the full traces' first lines, unchanged
    if MOONCAKE.exists():
        head = MOONCAKE.read_text(encoding="utf-8").splitlines()[:500]
        assert resolve_trace("mooncake").read_text(encoding="utf-8").splitlines() == head


def test_an_unknown_trace_name_gets_a_suggestion() -> None:
    with pytest.raises(TraceError, match=r"no bundled trace.*did you mean 'mooncake'\?"):
        load_trace("mooncak")
