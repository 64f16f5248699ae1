"""Log parsers: every format, chunking, hostile bytes, big and growing files."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.parser_lines import parse_all

from sweep.parsers import (
    LineSplitter,
    LogTail,
    Measurement,
    make_parser,
    read_tail,
    scan_file,
    select_measurement,
)

MYRTLE = {"type": "myrtle"}
TQDM_RE = {"type": "regex", "pattern": r"samples/s=(?P<throughput>[\d.]+)"}
STEP_RE = {
    "type": "regex",
    "pattern": r"step (?P<step>\d+)/\d+ .*?(?P<step_time>[\d.]+) ms/step .*?(?P<throughput>[\d.,]+) samples/s",
    "step_time_unit": "ms",
}
JSONL = {"type": "jsonl", "key": "metrics.samples_per_sec", "step_key": "step", "step_time_key": "metrics.step_time"}

# (spec, line, expected fields or None). Lines as the tools print them.
LINES = [
    # caiman-asr up to v1.11: epoch averages on stdout
    (MYRTLE, "DLL 2023-05-02 10:11:12.123456 - epoch    1 | avg train utts/s   729 | took 52.10 s",
     dict(throughput=729.0, epoch=1, step=None, epoch_time_s=52.1)),
    (MYRTLE, "DLL 2023-05-02 10:12:04.654321 - epoch    2 | avg train utts/s  1400 | took 12.34 s",
     dict(throughput=1400.0, epoch=2, step=None, epoch_time_s=12.34)),
    # v1.12 on: epoch averages and per-step lines (step tuple: epoch, iter/iters, step)
    (MYRTLE, "DLL 2024-01-02 10:11:12.123456 - epoch    2 | train_avg_throughput-audio-samples-per-sec :  1400.12 "
             "| train_avg_took :  12.34",
     dict(throughput=1400.12, epoch=2, step=None, epoch_time_s=12.34)),
    (MYRTLE, "DLL 2024-01-02 10:11:05.000001 - epoch    2 | iter   10/10 | step   20 | train_loss :  95.3125 "
             "| train_wer :  98.1 | train_noise/gradient :  0 | train_throughput-audio-samples-per-sec :  1391.74 "
             "| train_throughput-audio-secs-per-sec :  19856.2 | train_took :  0.7357 | train_lrate :  0.0001",
     dict(throughput=1391.74, epoch=2, step=20, step_time_s=0.7357)),
    # nvlog.json records
    (MYRTLE, 'DLLL {"timestamp": "1704190272.123456", "datetime": "2024-01-02 10:11:12.123456", '
             '"elapsedtime": "62.8", "type": "LOG", "step": [2], "data": '
             '{"train_avg_throughput-audio-samples-per-sec": 1400.12, "train_avg_took": 12.34}}',
     dict(throughput=1400.12, epoch=2, step=None, epoch_time_s=12.34)),
    (MYRTLE, 'DLLL {"timestamp": "1704190265.000001", "type": "LOG", "step": [2, 10, 10, 20], "data": '
             '{"train_loss": 95.3, "train_throughput-audio-samples-per-sec": 1391.74, '
             '"train_throughput-audio-secs-per-sec": 19856.2, "train_took": 0.7357}}',
     dict(throughput=1391.74, epoch=2, step=20, step_time_s=0.7357)),
    (MYRTLE, 'DLLL {"type": "LOG", "step": 3, "data": {"train_avg_throughput-audio-samples-per-sec": 1510.5}}',
     dict(throughput=1510.5, epoch=3, step=None)),
    (MYRTLE, 'DLLL {"type": "LOG", "step": [], "data": {"epoch": 4, "train_avg_utts/s": "1333.3"}}',
     dict(throughput=1333.3, epoch=4, step=None)),
    (MYRTLE, 'DLLL {"type": "LOG", "step": {"epoch": 5, "iter": 7}, "data": {"train_utts/s": 1200}}',
     dict(throughput=1200.0, epoch=5, step=7)),
    # dllogger's default tuple step format
    (MYRTLE, "DLL 2024-01-02 10:11:12.123456 - (2,) | train_avg_throughput-audio-samples-per-sec : 1401.0 utts/s",
     dict(throughput=1401.0, epoch=2, step=None)),
    # lines that carry no training throughput
    (MYRTLE, "DLL 2024-01-02 10:11:12.123456 - epoch    2 | dev_ema_loss :  88.3 | dev_ema_wer :  97.5 "
             "| dev_ema_throughput-audio-samples-per-sec :  9000.0 | dev_ema_took :  3.2", None),
    (MYRTLE, "DLL 2024-01-02 10:11:00.000001 - PARAMETER | global_batch_size : 1024 ", None),
    (MYRTLE, "DLL 2024-01-02 10:11:05.000001 - epoch    1 | iter    1/10 | train_throughput-audio-secs-per-sec :  1.5",
     None),
    (MYRTLE, 'DLLL {"timestamp": "1704190272.1", "type": "METADATA", "metric": "train_avg_took", '
             '"metadata": {"unit": "s", "format": ":.2f"}}', None),
    (MYRTLE, 'DLLL {"type": "LOG", "step": "PARAMETER", "data": {"num_gpus": 8}}', None),
    (MYRTLE, 'DLLL {"type": "LOG", "step": [2], "data": {"train_avg_throughput-audio-samples-per-sec": NaN}}', None),
    (MYRTLE, "DLLL {not json", None),
    (MYRTLE, "  Decoded:   the cat sat on the mat", None),
    # regex: a tqdm postfix, and per-step lines with step and step time
    (TQDM_RE, "Epoch 1:  40%|####      | 4/10 [00:02<00:03,  1.95it/s, loss=3.2, samples/s=1398.2]",
     dict(throughput=1398.2, step=1, step_time_s=None)),  # no step group: each matching line a step of its own, in order
    (STEP_RE, "2024-01-02 10:11:12 INFO train: step 20/100 loss 3.10 731.5 ms/step 1,399.8 samples/s",
     dict(throughput=1399.8, step=20, step_time_s=pytest.approx(0.7315))),
    (STEP_RE, "2024-01-02 10:11:12 INFO eval: wer 12.1", None),
    ({"type": "regex", "pattern": r"'train_samples_per_second': (?P<throughput>[\d.]+)"},
     "{'train_runtime': 12.3, 'train_samples_per_second': 1400.5, 'train_steps_per_second': 1.37}",
     dict(throughput=1400.5)),
    # jsonl: nested key, prefixed record, numeric string, missing key, non-JSON
    (JSONL, '{"step": 20, "metrics": {"samples_per_sec": 1400.5, "step_time": 0.731}}',
     dict(throughput=1400.5, step=20, step_time_s=0.731)),
    (JSONL, '2024-01-02 10:11:12 INFO {"step": 21, "metrics": {"samples_per_sec": "1399.5"}} trailing',
     dict(throughput=1399.5, step=21, step_time_s=None)),
    (JSONL, '{"step": 22, "metrics": {"loss": 3.1}}', None),
    (JSONL, '{"step": 23, "metrics": {"samples_per_sec": true}}', None),
    (JSONL, "step 24 samples_per_sec 1400", None),
    ({"type": "jsonl", "key": "perf.samples_per_sec"}, '{"perf.samples_per_sec": 1234.5}', dict(throughput=1234.5)),
    ({"type": "jsonl", "key": "ranks.0.tput"}, '{"ranks": [{"tput": 700.0}, {"tput": 690.0}]}', dict(throughput=700.0)),
]


@pytest.mark.parametrize("spec,line,expected", LINES)
def test_line_table(spec: dict, line: str, expected: dict | None) -> None:
    found = parse_all(spec, line.encode() + b"\n")
    if expected is None:
        assert found == []
        return
    assert len(found) == 1
    m = found[0]
    assert m.line == 1
    for name, value in expected.items():
        assert getattr(m, name) == value, name


@pytest.mark.parametrize("spec,line,expected", [row for row in LINES if row[2] is not None][:6])
def test_truncated_last_line_is_parsed_on_close(spec: dict, line: str, expected: dict) -> None:
    parser = make_parser(spec)
    assert parser.feed(line.encode()) == []  # no line break yet: it may still grow
    (m,) = parser.close()
    assert m.throughput == expected["throughput"]


def test_empty_spec_means_myrtle() -> None:
    assert type(make_parser({})).__name__ == "MyrtleParser"
    assert type(make_parser(None)).__name__ == "MyrtleParser"


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"type": "csv"}, "parser.type='csv' is not supported; valid types: jsonl, myrtle, regex, and the framework presets deepspeed, "
                         "fairseq, hf, lightning, megatron, nanochat, nanogpt, timm, torchtitan"),
        ({"pattern": "x"}, "parser: 'type' is missing; valid types: jsonl, myrtle, regex, and the framework presets deepspeed"),
        ({"type": "regex"}, "parser.type='regex' needs pattern"),
        ({"type": "regex", "pattern": r"(?P<tput>\d+)"}, "has no named group 'throughput'"),
        ({"type": "regex", "pattern": r"(?P<throughput>\d+"}, "does not compile: missing ), unterminated subpattern"),
        ({"type": "regex", "pattern": r"(?P<throughput>\d+)", "step_time_unit": "min"}, "step_time_unit='min'"),
        ({"type": "regex", "patern": "x"}, "unknown key(s) patern for type 'regex'; valid keys: pattern"),
        ({"type": "myrtle", "key": "x"}, "unknown key(s) key for type 'myrtle'; valid keys: none"),
        ({"type": "jsonl", "key": "metrics..tput"}, "parser.key must be a dotted key path"),
        ("myrtle", "parser: expected a mapping"),
    ],
)
def test_make_parser_errors_are_one_line(spec: object, message: str) -> None:
    with pytest.raises(ValueError) as info:
        make_parser(spec)  # type: ignore[arg-type]
    text = str(info.value)
    assert message in text
    assert "\n" not in text


# A realistic log mixing every format, progress bars, CRLF, ranks and junk.
SAMPLE_LOG = b"".join(
    [
        b"Done with training setup\n",
        b"Epoch 1:  10%|#         | 1/10 [00:01<00:09, samples/s=900.1]\r",
        b"Epoch 1:  20%|##        | 2/10 [00:02<00:08, samples/s=1100.4]\r",
        b"Epoch 1: 100%|##########| 10/10 [00:07<00:00, samples/s=1390.0]\n",
        b"DLL 2024-01-02 10:11:05.000001 - epoch    1 | iter   10/10 | step   10 | "
        b"train_throughput-audio-samples-per-sec :  1391.74 | train_took :  0.7357\r\n",
        b"DLL 2024-01-02 10:11:12.123456 - epoch    1 | train_avg_throughput-audio-samples-per-sec :  1200.5 "
        b"| train_avg_took :  14.1\n",
        b"\xff\xfe garbage \xc3\x28 bytes\n",
        b"[rank0]:DLLL {\"type\": \"LOG\", \"step\": [2], \"data\": "
        b"{\"train_avg_throughput-audio-samples-per-sec\": 1400.12, \"train_avg_took\": 12.34}}\n",
        b"1: {\"step\": 20, \"metrics\": {\"samples_per_sec\": 1400.5, \"step_time\": 0.731}}\n",
        b"caf\xc3\xa9 \xe2\x9c\x93 step 21/100 loss 3.1 730.0 ms/step 1401.0 samples/s\n",
        b"\x1b[32mDLL 2024-01-02 10:12:00.000001 - epoch    3 | avg train utts/s  1410 | took 12.1 s\x1b[0m\n",
        b"DLL 2024-01-02 10:12:30.000001 - epoch    4 | avg train utts/s  14",  # cut off mid-line
    ]
)
SPECS = [MYRTLE, TQDM_RE, STEP_RE, JSONL]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["type"] + ("-" + s["pattern"][:8] if "pattern" in s else ""))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=80))
def test_chunk_boundaries_do_not_matter(spec: dict, cuts: list[int]) -> None:
    assert parse_all(spec, SAMPLE_LOG, cuts) == parse_all(spec, SAMPLE_LOG)


@pytest.mark.parametrize("spec", [MYRTLE, TQDM_RE], ids=["myrtle", "regex"])
def test_every_single_cut_point_gives_the_same_result(spec: dict) -> None:
    whole = parse_all(spec, SAMPLE_LOG)
    for cut in range(len(SAMPLE_LOG) + 1):
        assert parse_all(spec, SAMPLE_LOG, [cut]) == whole, cut


def test_sample_log_readings() -> None:
    myrtle = parse_all(MYRTLE, SAMPLE_LOG)
    assert [(m.throughput, m.epoch, m.step, m.rank) for m in myrtle] == [
        (1391.74, 1, 10, None),
        (1200.5, 1, None, None),
        (1400.12, 2, None, 0),
        (1410.0, 3, None, None),
        (14.0, 4, None, None),  # the truncated last line, read as printed
    ]
    # each carriage-return redraw of the progress bar is a line of its own
    assert [m.throughput for m in parse_all(TQDM_RE, SAMPLE_LOG)] == [900.1, 1100.4, 1390.0]
    assert [m.line for m in parse_all(TQDM_RE, SAMPLE_LOG)] == [2, 3, 4]
    (jl,) = parse_all(JSONL, SAMPLE_LOG)
    assert (jl.throughput, jl.step, jl.rank, jl.line) == (1400.5, 20, 1, 9)
    (rx,) = parse_all(STEP_RE, SAMPLE_LOG)
    assert (rx.throughput, rx.step, rx.step_time_s) == (1401.0, 21, pytest.approx(0.73))


@pytest.mark.parametrize(
    "prefix,rank",
    [
        ("[rank3]:", 3), ("[rank3]: ", 3), ("[default3]:", 3),  # torchrun
        ("3: ", 3), ("  3: ", 3),  # srun --label
        ("[1,3]<stdout>:", 3),  # mpirun --tag-output
        ("", None),
    ],
)
def test_rank_prefixes(prefix: str, rank: int | None) -> None:
    line = prefix + "DLL 2024-01-02 10:11:12.1 - epoch    2 | train_avg_throughput-audio-samples-per-sec :  1400.12"
    (m,) = parse_all(MYRTLE, line.encode() + b"\n")
    assert (m.throughput, m.rank) == (1400.12, rank)
    anchored = {"type": "regex", "pattern": r"^tput=(?P<throughput>\d+)"}
    (m,) = parse_all(anchored, (prefix + "tput=700\n").encode())
    assert (m.throughput, m.rank) == (700.0, rank)


def test_interleaved_ranks_keep_their_lines() -> None:
    log = b"".join(
        f"[rank{r}]: step {s}/100 loss 3.0 {700 + r}.0 ms/step {1400 - r}.0 samples/s\n".encode()
        for s in (1, 2)
        for r in (0, 1)
    )
    found = parse_all(STEP_RE, log)
    assert [(m.rank, m.step, m.throughput) for m in found] == [
        (0, 1, 1400.0), (1, 1, 1399.0), (0, 2, 1400.0), (1, 2, 1399.0)
    ]


def test_non_utf8_and_split_multibyte_characters() -> None:
    line = "naïve ✓ samples/s=1234.5\n".encode()
    parser = make_parser(TQDM_RE)
    found = [m for i in range(len(line)) for m in parser.feed(line[i : i + 1])]  # one byte at a time
    assert [m.throughput for m in found] == [1234.5]
    latin1 = "café samples/s=99.5\n".encode("latin-1")
    assert [m.throughput for m in parse_all(TQDM_RE, latin1)] == [99.5]


@pytest.mark.parametrize("spec", SPECS + [{"type": "jsonl", "key": "a"}], ids=lambda s: s["type"])
@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 64), max_size=20))
def test_fuzz_random_bytes_never_raise(spec: dict, data: bytes, cuts: list[int]) -> None:
    found = parse_all(spec, data, cuts)
    assert isinstance(found, list)
    assert all(isinstance(m, Measurement) and m.throughput >= 0 for m in found)


_FRAGMENTS = [
    s.encode()
    for s in (
        "DLL ", "DLLL ", " - ", "epoch ", "iter ", " | ", " : ", "{", "}", '"data"', '"step"', "[", "]",
        "samples/s=", "train_avg_throughput-audio-samples-per-sec", "1400.5", "9" * 30,
        "\r", "\n", "\r\n", "[rank1]:", "0: ", "\xff", "\x1b[0m",
    )
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["type"])
@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(st.sampled_from(_FRAGMENTS + [b"\xff\xfe", b"\xc3"]), max_size=40),
       cut=st.integers(0, 400))
def test_fuzz_near_miss_and_truncated_input(spec: dict, pieces: list[bytes], cut: int) -> None:
    data = b"".join(pieces)
    for variant in (data, data[:cut]):  # whole, and cut off anywhere
        found = parse_all(spec, variant)
        assert all(isinstance(m, Measurement) for m in found)
    assert parse_all(spec, data, [cut]) == parse_all(spec, data)


@settings(max_examples=200, deadline=None)
@given(data=st.lists(st.sampled_from([b"a", b"bb", b"\r", b"\n", b"\r\n", b"x" * 20]), max_size=30).map(b"".join),
       cuts=st.lists(st.integers(0, 25), max_size=15))
def test_splitter_is_chunking_independent_even_for_overlong_lines(data: bytes, cuts: list[int]) -> None:
    def split(chunks: list[bytes]) -> list[bytes]:
        splitter = LineSplitter(max_line_bytes=8)
        return [line for c in chunks for line in splitter.feed(c)] + splitter.close()

    pieces, pos = [], 0
    for size in cuts:
        pieces.append(data[pos : pos + size])
        pos += size
    pieces.append(data[pos:])
    whole = split([data])
    assert split(pieces) == whole
    assert all(len(line) <= 8 for line in whole)
    assert len(whole) == len(data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")) - (
        data.endswith((b"\n", b"\r")) or not data
    )


def test_feed_rejects_text() -> None:
    with pytest.raises(TypeError, match="takes bytes"):
        make_parser(MYRTLE).feed("DLL ...")  # type: ignore[arg-type]


def _write_big_log(path: Path, size: int) -> None:
    """A log of `size` bytes of progress-bar noise between two epoch lines; the last one unterminated."""
    noise = (
        b"[rank0]: Epoch 1:  40%|####      | 4/10 [00:02<00:03,  1.95it/s, loss=3.2]\r" * 12
        + b"2024-01-02 10:11:12 INFO   Decoded:   the cat sat on the mat and then it sat on the hat again\n"
    )
    block = noise * ((1 << 20) // len(noise))
    with open(path, "wb") as f:
        f.write(b"DLL 2024-01-02 10:11:12.123456 - epoch    1 | avg train utts/s   729 | took 52.10 s\n")
        while f.tell() < size:
            f.write(block)
        f.write(b"DLL 2024-01-02 10:12:04.654321 - epoch    2 | avg train utts/s  1400 | took 12.34 s")


def test_large_log_is_streamed_to_the_last_measurement(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    _write_big_log(path, 50 << 20)
    parser = make_parser(MYRTLE)
    found = scan_file(path, parser, chunk_size=1 << 20)
    assert [(m.epoch, m.throughput) for m in found] == [(1, 729.0), (2, 1400.0)]
    assert found[-1].line == parser.lines_seen > 650_000


def test_scanning_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    _write_big_log(path, 8 << 20)
    tracemalloc.start()  # slows allocation down ~10x, hence the smaller log
    try:
        found = scan_file(path, make_parser(MYRTLE), chunk_size=256 << 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert found[-1].throughput == 1400.0
    assert peak < 4 << 20, f"peak {peak / 2**20:.1f} MiB while scanning an 8 MiB log"


def test_read_tail_reads_only_the_end(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"x" * 10_000 + b"\nfirst whole line\nTraceback (most recent call last):\n")
    assert read_tail(path, max_bytes=60) == "first whole line\nTraceback (most recent call last):\n"
    assert read_tail(path, max_bytes=10**6).startswith("xxx")
    assert read_tail(tmp_path / "missing") == ""
    # start: nothing before that byte (a warm worker's earlier trials), a torn line there dropped.
    start = 10_001
    assert read_tail(path, start=start) == "first whole line\nTraceback (most recent call last):\n"
    assert read_tail(path, start=start + 3) == "Traceback (most recent call last):\n"
    assert read_tail(path, start=path.stat().st_size) == ""


# --- LogTail -------------------------------------------------------------------------------


def test_logtail_before_the_file_exists_and_while_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "trial.log"
    tail = LogTail(path, chunk_size=8)
    assert tail.read_new() == b""
    path.write_bytes(b"hello ")
    assert tail.read_new() == b"hello "
    assert tail.read_new() == b""
    with open(path, "ab") as f:
        f.write(b"world, a longer line\n")
    got = b""
    while chunk := tail.read_new():
        assert len(chunk) <= 8
        got += chunk
    assert got == b"world, a longer line\n"
    assert tail.restarts == 0
    tail.close()


def test_logtail_restarts_after_truncation(tmp_path: Path) -> None:
    path = tmp_path / "trial.log"
    path.write_bytes(b"first run, quite long\n")
    with LogTail(path) as tail:
        assert tail.read_new() == b"first run, quite long\n"
        path.write_bytes(b"second\n")  # reopened with "w": same file, now shorter
        assert tail.read_new() == b"second\n"
        assert tail.restarts == 1


def test_logtail_drains_a_rotated_file_then_follows_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "trial.log"
    path.write_bytes(b"old 1\n")
    tail = LogTail(path)
    assert tail.read_new() == b"old 1\n"
    with open(path, "ab") as f:
        f.write(b"old 2\n")
    os.rename(path, tmp_path / "trial.log.1")
    assert tail.read_new() == b"old 2\n"  # written before the rotation: not lost
    assert tail.read_new() == b""  # the new file does not exist yet
    path.write_bytes(b"new 1\n")
    assert tail.read_new() == b"new 1\n"
    assert tail.restarts == 1
    tail.close()


def test_logtail_feeds_a_parser_across_partial_writes(tmp_path: Path) -> None:
    path = tmp_path / "trial.log"
    tail, parser = LogTail(path, chunk_size=16), make_parser(MYRTLE)
    line = b"DLL 2024-01-02 10:11:12.123456 - epoch    2 | train_avg_throughput-audio-samples-per-sec :  1400.12\n"
    found: list[Measurement] = []
    for i in range(0, len(line), 37):  # the writer flushes at arbitrary points
        with open(path, "ab") as f:
            f.write(line[i : i + 37])
        while chunk := tail.read_new():
            found += parser.feed(chunk)
    assert [m.throughput for m in found] == [1400.12]
    tail.close()


# --- choosing the figure ------------------------------------------------------------------


def test_select_prefers_the_second_epoch_average() -> None:
    ms = [
        Measurement(1391.0, epoch=1, step=10, line=1),
        Measurement(1200.0, epoch=1, line=2),
        Measurement(1405.0, epoch=2, step=20, line=3),
        Measurement(1400.0, epoch=2, line=4),
        Measurement(1380.0, epoch=3, line=5),
    ]
    sel = select_measurement(ms)
    assert sel is not None and sel.measurement.line == 4 and sel.after_warmup and sel.throughput == 1400.0
    assert "epoch 2 average" in sel.note and "\n" not in sel.note


def test_select_falls_back_to_the_last_figure_and_says_so() -> None:
    sel = select_measurement([Measurement(1200.0, epoch=1, line=7)])
    assert sel is not None and sel.measurement.line == 7 and not sel.after_warmup
    assert "includes warm-up" in sel.note
    sel = select_measurement([Measurement(100.0, step=1, line=1), Measurement(140.0, step=2, line=2)])
    assert sel is not None and sel.measurement.throughput == 140.0 and "no epochs" in sel.note
    assert select_measurement([]) is None


def test_select_counts_epochs_as_they_appear() -> None:
    resumed = [Measurement(900.0, epoch=5, line=1), Measurement(1400.0, epoch=6, line=2)]
    sel = select_measurement(resumed)
    assert sel is not None and sel.measurement.epoch == 6
    steps_only = [Measurement(1000.0, epoch=1, step=1), Measurement(1390.0, epoch=2, step=11),
                  Measurement(1395.0, epoch=2, step=12)]
    sel = select_measurement(steps_only)
    assert sel is not None and sel.measurement.step == 12 and "last step" in sel.note
    assert select_measurement(resumed, skip_first_epochs=0).measurement.epoch == 5  # type: ignore[union-attr]


# --- issue 30: logs whose figures were dropped or misread. Lines written from each framework's own format
# string (or rendered by tqdm itself), not from a summary of them.
from support.parser_lines import caiman_step, lightning_postfix  # noqa: E402

from sweep.parsers import parser_settings  # noqa: E402
from sweep.parsers.throughput import IGNORED, MEASURED  # noqa: E402


def test_nemo_asr_bars_with_step_timing_and_no_step_number_keep_every_figure() -> None:
    """NeMo ASR on plain Lightning: TimingCallback's `train_step_timing in s` in TQDMProgressBar's postfix,
    no global_step. 36 of 37 figures were dropped and one kept as an "epoch average". Every bar is read, by
    its rate (issue 45: the callback's time leaves out the loading between batches; the bar's rate does not)."""
    tqdm = pytest.importorskip("tqdm")
    times = [0.9 + (i % 5) / 100 for i in range(37)]
    lines = [
        tqdm.tqdm.format_meter(i + 1, 300, sum(times[: i + 1]), prefix="Epoch 0", rate=1 / t,
                               postfix=f"v_num=0, train_step_timing in s={lightning_postfix(t)}")
        for i, t in enumerate(times)
    ]
    found = parse_all({"type": "lightning"}, ("\r".join(lines) + "\n").encode())
    assert [m.step for m in found] == list(range(1, 38)) and {m.unit for m in found} == {"batches/s"}
    s = parser_settings({"type": "lightning"}).summarize(found, global_batch_size=64, accum=2)
    assert s.measured == 37 - 3 and s.warmup == 3 and "per-step" in s.note
    # micro-batches per s: 64 / 2 samples in each (the bar rounds its rate to 3 digits)
    assert s.value == pytest.approx(32 / sorted(times[3:])[len(times[3:]) // 2], rel=1e-2)


def test_tqdm_bars_without_a_width_are_read() -> None:
    """ncols=0 (dynamic_ncols where the terminal reports no width): tqdm prints no bar, just the stats."""
    tqdm = pytest.importorskip("tqdm")
    line = tqdm.tqdm.format_meter(60, 1230545, 13.1, ncols=0, rate=4.58)
    assert "|" not in line and "60/1230545" in line
    (m,) = parse_all({"type": "hf"}, (line + "\n").encode())
    assert (m.value, m.unit, m.step) == (4.58, "steps/s", 60)
    nemo = tqdm.tqdm.format_meter(12, 300, 13.1, ncols=0, prefix="Epoch 1", postfix="v_num=0, train_step_timing in s=1.090")
    (n,) = parse_all({"type": "lightning"}, (nemo + "\n").encode())
    assert (n.value, n.unit, n.step, n.epoch) == (1.09, "s/batch", 12, 1)  # the bar's own `1.09s/it`


def test_hf_eval_on_start_bar_is_not_read_as_training(tmp_path: Path) -> None:
    """eval_on_start: ProgressCallback opens the training bar (total=max_steps), then the evaluation bar
    (total=len(eval_dataloader), leave=False) runs first, below it. With the same total it was read as training."""
    import time

    tqdm = pytest.importorskip("tqdm")
    log = tmp_path / "hf.log"
    with log.open("w") as f:
        args = dict(file=f, dynamic_ncols=True, mininterval=0)  # mininterval=0: every update drawn, so the test is short
        training_bar = tqdm.tqdm(total=20, **args)
        prediction_bar = tqdm.tqdm(total=20, leave=training_bar is None, **args)
        for _ in range(20):
            time.sleep(0.001)
            prediction_bar.update(1)
        prediction_bar.close()
        training_bar.write(str({"eval_loss": 2.3, "eval_runtime": 0.03, "eval_samples_per_second": 666.6}))
        for _ in range(20):
            time.sleep(0.02)
            training_bar.update(1)
        training_bar.close()
    found = parse_all({"type": "hf"}, log.read_bytes())
    steps = [m for m in found if m.unit in ("steps/s", "s/step")]
    assert steps and all(m.value < 60 for m in steps), [m.value for m in found]  # eval ran at ~1000 it/s
    assert sorted({m.step for m in steps}) == list(range(1, 21))


def test_deepspeed_pipeline_engine_line() -> None:
    """deepspeed/runtime/pipe/engine.py train_batch: print(f'steps: {self.global_steps} ' f'loss: ...:0.4f} '
    f'iter time (s): {iter_time:0.3f} ' f'samples/sec: {tput:0.3f}')"""
    global_steps, loss, iter_time, tput = 10, 2.3456, 0.468, 273.344
    line = f"steps: {global_steps} loss: {loss:0.4f} iter time (s): {iter_time:0.3f} samples/sec: {tput:0.3f}"
    (m,) = parse_all({"type": "deepspeed"}, (line + "\n").encode())
    assert (m.value, m.unit, m.step, m.step_time_s) == (273.344, "samples/s", 10, 0.468)
    # torchrun's rank prefix, as the engine prints on global rank 0 only
    (p,) = parse_all({"type": "deepspeed"}, f"[rank0]: {line}\n".encode())
    assert (p.value, p.rank) == (273.344, 0)


def test_caiman_asr_with_two_step_lines_uses_them_not_the_epoch_average() -> None:
    """caiman-asr's epoch average includes validation; with 1-2 per-step lines it was used anyway,
    and the note beside it said the per-step figures were."""
    log = "\n".join([
        caiman_step(1, 1, 1, 900.0), caiman_step(1, 2, 2, 1000.0),
        "DLL 2024-01-02 10:11:12.123456 - epoch    1 | train_avg_throughput-audio-samples-per-sec :  700.00 | train_avg_took :  12.34",
        caiman_step(2, 1, 3, 1400.0), caiman_step(2, 2, 4, 1420.0),
        "DLL 2024-01-02 10:11:30.123456 - epoch    2 | train_avg_throughput-audio-samples-per-sec :  1100.00 | train_avg_took :  12.34",
    ]) + "\n"
    found = parse_all(MYRTLE, log.encode())
    s = parser_settings(MYRTLE).summarize(found, global_batch_size=64)
    assert s.value == pytest.approx(1410.0) and s.measured == 2 and s.note.startswith("median of 2 per-step figures")
    average = next(f for f in s.figures if f.measurement.step is None and f.measurement.epoch == 2)
    assert (average.role, average.note) == (IGNORED, "per-step figures are used")
    assert [f.measurement.value for f in s.figures if f.role == MEASURED] == [1400.0, 1420.0]


def test_a_regex_without_a_step_group_reads_lines_once_a_step_as_per_step_figures() -> None:
    """Issue 50: a pattern with no `step` group (docs/trainers.md: optional) read each line as an average, of which the
    summary kept one, the first after the warm-up, and the cross-check then put the log 25% from the probe. Each line is
    a step's figure, numbered in order, and the summary is their median; with `epoch` alone a line is an epoch's average."""
    from sweep.parsers.throughput import BatchContext, summarize

    rates = [500, 1250, 1000, 1010, 990, 1005, 995, 1000, 1002, 998]  # the warm-up's, then a first step 25% fast
    log = "".join(f"throughput {r} samples/s\n" for r in rates).encode()
    figures = parse_all({"type": "regex", "pattern": r"throughput (?P<throughput>[\d.]+) samples/s"}, log)
    assert [m.step for m in figures] == list(range(1, len(rates) + 1))
    summary = summarize(figures, BatchContext(global_batch_size=64), skip_first=1)
    assert summary.value == pytest.approx(1000.0, abs=5) and summary.measured == len(rates) - 1, summary.note
    assert "per-step figures" in summary.note
    epochs = parse_all({"type": "regex", "pattern": r"epoch (?P<epoch>\d+) avg (?P<throughput>[\d.]+)"}, b"epoch 1 avg 900\nepoch 2 avg 1000\n")
    assert [(m.epoch, m.step) for m in epochs] == [(1, None), (2, None)]  # an epoch's average stays one
