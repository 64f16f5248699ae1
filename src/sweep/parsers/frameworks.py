"""Line parsers for the popular trainers' own log lines (used by the presets in presets.py).

Each reads what its framework prints as it is printed (units in sweep.parsers.throughput);
turning figures into samples/s or tokens/s is throughput.py's job. Lines reach
parse_line with colour codes and rank prefixes already removed (lines.clean_line);
a progress bar redrawn with \\r arrives as one line per redraw.
"""

from __future__ import annotations

import json
import re

from sweep.parsers.lines import LineParser, Measurement, to_float, to_int
from sweep.parsers.throughput import (
    BATCHES_PER_S,
    MS_PER_STEP,
    S_PER_BATCH,
    S_PER_STEP,
    SAMPLES_PER_S,
    STEPS_PER_S,
    TOKENS_PER_S,
)

_NUM = r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_Q = r"['\"]?"  # newer releases print some values as quoted strings


class NanoGPTParser(LineParser):
    """karpathy/nanoGPT train.py: `iter N: loss X, time Yms, mfu Z%` (ms per optimizer step).

    The `step N: train loss X, val loss Y` evaluation lines carry no time and are not read.
    """

    needle = b"iter "
    _rx = re.compile(rf"\biter (?P<step>\d{{1,18}}): loss \S+, time (?P<ms>{_NUM})\s*ms")

    def parse_line(self, text: str) -> Measurement | None:
        m = self._rx.search(text)
        ms = to_float(m.group("ms")) if m else None
        if m is None or not ms:  # None, or 0: a step time of zero is no measurement
            return None
        return Measurement(ms, step=int(m.group("step")), unit=MS_PER_STEP, step_time_s=ms / 1000.0)


class MegatronParser(LineParser):
    """NVIDIA/Megatron-LM training.py training_log: ` iteration N/ M | ... | elapsed time per iteration (ms): X | ... |
    global batch size: B |` (ms per iteration = one optimizer step on the global batch)."""

    needle = b"elapsed time per iteration"
    _rx = re.compile(rf"\biteration\s+(?P<step>\d{{1,18}})\s*/\s*\S+\s*\|.*?elapsed time per iteration \(ms\):\s*(?P<ms>{_NUM})")
    _gbs = re.compile(r"global batch size:\s*(\d{1,12})\b")

    def parse_line(self, text: str) -> Measurement | None:
        m = self._rx.search(text)
        ms = to_float(m.group("ms")) if m else None
        if m is None or not ms:  # Megatron prints 0.0 for iterations it did not time
            return None
        g = self._gbs.search(text)
        return Measurement(
            ms, step=int(m.group("step")), unit=MS_PER_STEP, step_time_s=ms / 1000.0,
            global_batch_size=int(g.group(1)) if g else None,
        )


# tqdm's default bar: `desc: 45%|####5     | 9/20 [00:03<00:04,  2.61it/s, postfix]`; with no width
# for the bar (ncols=0, e.g. dynamic_ncols where the terminal reports 0 columns) tqdm.format_meter
# returns l_bar[:-1] + r_bar[1:]: `desc:  0% 60/1230545 [00:13<74:35:12,  4.58it/s]`.
_TQDM = re.compile(
    r"^(?P<desc>.*?)(?P<pct>\d{1,3})%(?:\|[^|]*\||(?= ))\s*(?P<n>\d{1,18})/(?P<total>\d{1,18}|\?)\s*"
    rf"\[[^,\]]*(?:,\s*(?P<rate>{_NUM})\s*(?P<per>it/s|s/it))?"
)


class HFTrainerParser(LineParser):
    """huggingface/transformers Trainer: its tqdm bar (trainer_callback.py ProgressCallback; it counts optimizer
    steps: it/s or s/it) and the final summary dict `{'train_runtime': ..., 'train_samples_per_second': ...}`
    (trainer.py speed_metrics; newer releases print values as quoted strings).

    The evaluation bar has no description either; it is told apart by its total: the first bar
    without a description is the training bar, and bars with another total are not read.
    `eval_samples_per_second` is never read.
    """

    _summary = re.compile(rf"['\"]train_samples_per_second['\"]\s*:\s*{_Q}(?P<v>{_NUM}){_Q}")

    def __init__(self) -> None:
        super().__init__()
        self._train_total: str | None = None

    def _parse_lines(self, lines: list[bytes]) -> list[Measurement]:
        # tqdm draws a second bar below the first and moves back up with ESC[A: HF's evaluation bar while
        # the training bar is open (mid-training, or eval_on_start before any step, where it may have
        # the training bar's total). Blanked, not dropped, so line numbers stay the log's.
        return super()._parse_lines([b"" if b"\x1b[A" in line else line for line in lines])

    def parse_line(self, text: str) -> Measurement | None:
        s = self._summary.search(text)
        if s:
            v = to_float(s.group("v"))
            return None if v is None else Measurement(v, unit=SAMPLES_PER_S)
        b = _TQDM.search(text)
        if b is None or b.group("desc").strip():
            return None
        if self._train_total is None:
            self._train_total = b.group("total")
        if b.group("total") != self._train_total or b.group("rate") is None:
            return None
        v = to_float(b.group("rate"))
        if v is None or v == 0:
            return None
        unit = STEPS_PER_S if b.group("per") == "it/s" else S_PER_STEP
        return Measurement(v, step=int(b.group("n")), unit=unit)


class TorchTitanParser(LineParser):
    """pytorch/torchtitan metrics.py MetricsProcessor.log: `step: N  loss: X  memory: ...GiB(..%)  tps: 1,234
    tflops: ...  mfu: ...%` (tokens/s per device; early releases called it `wps:`). `validate step:` lines
    are not read."""

    needle = b"ps:"
    _rx = re.compile(rf"(?<![\w])step:\s*(?P<step>\d{{1,18}})\b.*?\b[tw]ps:\s*(?P<tps>{_NUM})")

    def parse_line(self, text: str) -> Measurement | None:
        if re.search(r"\b(?:validate|validation|eval)\w*\s+step:", text, re.IGNORECASE):
            return None
        m = self._rx.search(text)
        v = to_float(m.group("tps")) if m else None
        if m is None or v is None:
            return None
        return Measurement(v, step=int(m.group("step")), unit=TOKENS_PER_S, per_device=True)


class LightningParser(LineParser):
    """Lightning's progress bar and NeMo's step timing.

    - NeMo: `train_step_timing in s`, in the bar's postfix (`...=5.900`, NeMo 1) or NeMo 2's progress printer (`Training epoch 0, iteration 1/249 | ... | global_step: 1 | ...
      train_step_timing in s: 2.505`). NeMo's TimingCallback times each Lightning batch
      (on_train_batch_start to _end). With a global_step (NeMo 2, Megatron-based: a batch is the global
      batch) it is s per optimizer step. Without one (NeMo ASR on plain Lightning, where
      accumulate_grad_batches feeds micro-batches) the bar beside it is read, as on any Lightning bar: its
      rate (`1.94it/s`) counts the whole loop, the data loading between batches too, which the callback's
      time leaves out; only a bar with no rate yet is read by that time, as s per micro-batch.
    - NeMo's DeltaTimingCallback (NeMo's MLPerf LLM recipes): `Step 12 train_step_timing 0.7812 timestamp: ...`
      (also written `Step 12: train_step_timing in s=0.78`), the time from one Lightning batch's end to the
      next: a global batch in those Megatron-based models, so s per optimizer step.
    - Lightning: the `Epoch N:` tqdm bar (TQDMProgressBar) or the rich bar (`Epoch 0/9 ━━ 9/20 0:00:03 •
      0:00:04 2.61it/s`; `Epoch 0/-2` when max_epochs is unset); both count dataloader batches, i.e. micro-batches (batches/s).
    Validation, sanity-check, test and predict bars are not read.
    """

    _nemo = re.compile(rf"train_step_timing in s\s*[=:]\s*{_Q}(?P<v>{_NUM})")
    _delta = re.compile(rf"^\s*Step (?P<step>\d{{1,18}}):? train_step_timing(?: in s)?\s*[=:]?\s*(?P<v>{_NUM})")
    _nemo_step = re.compile(rf"global_step\s*[=:]\s*{_Q}(?P<v>{_NUM})")
    _nemo_iter = re.compile(r"iteration\s+(\d{1,18})\s*/")
    _epoch = re.compile(r"^\s*Epoch (?P<epoch>\d{1,9})(?:/\d+)?\s*:?")
    _rich = re.compile(
        rf"^\s*Epoch (?P<epoch>\d{{1,9}})/-?\d+\s+\S*\s*(?P<n>\d{{1,18}})/(?P<total>\d+)\s+\S+\s+\S+\s+\S+\s+(?P<rate>{_NUM})(?P<per>it/s|s/it)"
    )

    def parse_line(self, text: str) -> Measurement | None:
        d = self._delta.match(text)
        if d:
            v = to_float(d.group("v"))
            return Measurement(v, step=int(d.group("step")), unit=S_PER_STEP, step_time_s=v) if v else None
        n = self._nemo.search(text)
        if n:
            v = to_float(n.group("v"))
            if v is None or v == 0:
                return None
            st = self._nemo_step.search(text)
            step = to_int(st.group("v")) if st else None
            if step is None:
                it = self._nemo_iter.search(text)
                step = int(it.group(1)) if it else None
            unit = S_PER_STEP
            if step is None:
                r = self._rich.search(text)
                if r:
                    return self._bar(r.group("epoch"), r.group("n"), r.group("rate"), r.group("per"))
                bar = _TQDM.search(text)
                if bar is None:
                    return None  # no step and no bar: nothing says which batch the time is for
                e = self._epoch.match(text)
                if bar.group("rate") is not None and e is not None:
                    return self._bar(e.group("epoch"), bar.group("n"), bar.group("rate"), bar.group("per"))
                step, unit = int(bar.group("n")), S_PER_BATCH
            e = re.search(r"\b[Ee]poch\s+(\d{1,9})", text)
            g = re.search(r"global_batch_size\s*[=:]\s*(\d{1,12})\b", text)
            return Measurement(
                v, epoch=int(e.group(1)) if e else None, step=step, unit=unit, step_time_s=v if unit == S_PER_STEP else None,
                global_batch_size=int(g.group(1)) if g else None,
            )
        r = self._rich.search(text)
        if r:
            return self._bar(r.group("epoch"), r.group("n"), r.group("rate"), r.group("per"))
        e = self._epoch.match(text)
        if e is None:
            return None
        b = _TQDM.search(text)
        if b is None or b.group("rate") is None:
            return None
        return self._bar(e.group("epoch"), b.group("n"), b.group("rate"), b.group("per"))

    @staticmethod
    def _bar(epoch: str, n: str, rate: str, per: str) -> Measurement | None:
        v = to_float(rate)
        if v is None or v == 0:
            return None
        return Measurement(v, epoch=int(epoch), step=int(n), unit=BATCHES_PER_S if per == "it/s" else S_PER_BATCH)


class DeepSpeedParser(LineParser):
    """microsoft/DeepSpeed deepspeed/utils/timer.py ThroughputTimer (printed every steps_per_print steps):
    `epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=25.02, CurrSamplesPerSec=25.70, ...`;
    older releases `0/20, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=...` or `0/20, SamplesPerSec=...`.

    CurrSamplesPerSec (that step, global) is read; the running average since start-up only
    where a release prints nothing else. The pipeline engine (deepspeed/runtime/pipe/engine.py
    train_batch) prints its own line instead: `steps: 10 loss: 2.3456 iter time (s): 0.468
    samples/sec: 273.344`, the global batch over the mean step time of the last steps_per_print steps.
    """

    needle = b"amples"  # SamplesPerSec= and samples/sec:
    _pipe = re.compile(rf"\bsteps:\s*(?P<step>\d{{1,18}})\b.*?iter time \(s\):\s*(?P<t>{_NUM})\s+samples/sec:\s*(?P<v>{_NUM})")
    _index = re.compile(r"(?:epoch=(?P<e>\d{1,9})/micro_step=\d+/global_step=(?P<g>\d{1,18})|\b(?P<oe>\d{1,9})/(?P<os>\d{1,18})),")
    _curr = re.compile(rf"\bCurrSamplesPerSec=(?P<v>{_NUM})")
    _avg = re.compile(rf"(?<![A-Za-z])(?:RunningAvg)?SamplesPerSec=(?P<v>{_NUM})")

    def parse_line(self, text: str) -> Measurement | None:
        pipe = self._pipe.search(text)
        if pipe:
            v = to_float(pipe.group("v"))
            if not v:
                return None
            return Measurement(v, step=int(pipe.group("step")), unit=SAMPLES_PER_S, step_time_s=to_float(pipe.group("t")))
        m = self._curr.search(text) or self._avg.search(text)
        v = to_float(m.group("v")) if m else None
        if m is None or v is None:
            return None
        i = self._index.search(text)
        epoch = step = None
        if i:
            epoch = int(i.group("e") or i.group("oe"))
            step = int(i.group("g") or i.group("os"))
        return Measurement(v, epoch=epoch, step=step, unit=SAMPLES_PER_S)


class FairseqParser(LineParser):
    """facebookresearch/fairseq logging/progress_bar.py, `train_inner` records: simple
    (`epoch 001:    100 / 1000 loss=9.81, ..., wps=12345.6, ups=3.21, wpb=3840, bsz=128, num_updates=100, ...`)
    or JSON (`{"epoch": 1, "update": 0.1, "loss": "9.81", ..., "wps": "12345.6", ...}`).

    wps (target tokens per second, summed over workers) is read; wpb / bsz gives tokens per
    sample. Validation records (`valid` tag, `valid_` keys) are not read.
    """

    needle = b"wps"
    _simple = re.compile(r"\bepoch (?P<epoch>\d{1,9}):\s+(?P<i>\d{1,18})\s*/\s*\d+\s+(?P<stats>.*)$")

    def parse_line(self, text: str) -> Measurement | None:
        if re.search(r"\|\s*valid\b|\bvalid_|valid on '", text):
            return None
        brace = text.find("{")
        if brace >= 0:
            try:
                rec, _ = json.JSONDecoder().raw_decode(text, brace)
            except (ValueError, RecursionError):
                rec = None
            if isinstance(rec, dict):
                return self._record({str(k): v for k, v in rec.items()}, to_int(rec.get("epoch")))
        m = self._simple.search(text)
        if m is None:
            return None
        stats = {}
        for part in m.group("stats").split(","):
            key, eq, val = part.strip().partition("=")
            if eq:
                stats[key.strip()] = val.strip()
        return self._record(stats, int(m.group("epoch")))

    @staticmethod
    def _record(stats: dict, epoch: int | None) -> Measurement | None:
        wps = to_float(stats.get("wps"))
        if wps is None:
            return None
        wpb, bsz = to_float(stats.get("wpb")), to_float(stats.get("bsz"))
        tps = wpb / bsz if wpb and bsz else None
        return Measurement(wps, epoch=epoch, step=to_int(stats.get("num_updates")), unit=TOKENS_PER_S, tokens_per_sample=tps)


class TimmParser(LineParser):
    """huggingface/pytorch-image-models train.py: `Train: E [ i/N (..%)]  Loss: ...  Time: 0.320s, 400.32/s
    (0.330s, 387.9/s)  LR: ...` (samples/s of that update, all devices). `Test:` lines are not read."""

    needle = b"Train:"
    _rx = re.compile(
        rf"\bTrain: (?P<epoch>\d{{1,9}}) \[\s*(?P<i>\d{{1,18}})/\s*\d+[^\]]*\].*?\bTime:\s*(?P<t>{_NUM})s,\s*(?P<v>{_NUM})/s"
    )

    def parse_line(self, text: str) -> Measurement | None:
        m = self._rx.search(text)
        v = to_float(m.group("v")) if m else None
        if m is None or v is None:
            return None
        return Measurement(v, epoch=int(m.group("epoch")), step=int(m.group("i")), unit=SAMPLES_PER_S, step_time_s=to_float(m.group("t")))


class NanochatParser(LineParser):
    """karpathy/nanochat scripts/base_train.py: `step 00012/01000 (1.20%) | loss: ... | dt: 651.23ms |
    tok/sec: 740,000 | mfu: ... | total time: ...` (tokens/s, all devices). Evaluation lines carry no tok/sec."""

    needle = b"tok/sec"
    _rx = re.compile(rf"\bstep (?P<step>\d{{1,18}})(?:/\d+)?\b.*?\btok/sec:\s*(?P<v>{_NUM})")
    _dt = re.compile(rf"\bdt:\s*(?P<ms>{_NUM})ms")

    def parse_line(self, text: str) -> Measurement | None:
        m = self._rx.search(text)
        v = to_float(m.group("v")) if m else None
        if m is None or v is None:
            return None
        dt = self._dt.search(text)
        ms = to_float(dt.group("ms")) if dt else None
        return Measurement(v, step=int(m.group("step")), unit=TOKENS_PER_S, step_time_s=None if ms is None else ms / 1000.0)
