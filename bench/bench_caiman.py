"""caiman-asr's published batch table, reproduced from one device; and the fused joint's memory per cell.

    python bench/bench_caiman.py [--cpu] [--budget-min MINUTES] [--keep DIR]

1. Joint memory accounting (always, on CPU): the built-in workload's joint_and_loss (the code a
   trial runs) at caiman-asr's vocabularies, reference vs fused, padded and packed, fp32 and fp16
   autocast. Every tensor storage the step allocates is counted by a torch dispatch mode (a direct
   count, not an estimate); bytes per lattice cell is the slope of the peak between lattices of
   three sizes, so fixed costs (the weight gradients) drop out. A small joint_hidden (64) keeps the
   hidden layer's share (H/V of a cell) out of the figure. Checks: the fused joint at most 2.5
   bytes a cell under fp16 and 4.5 under fp32, the reference at least 4x the fused under fp16.
2. The four rows of caiman-asr's current table (docs/training_times.md, v1.12-v1.14), each a real
   `python -m sweep` of the built-in RNN-T, one rank's share of the recipe on one device:
     8 x A100 80GB    base, large: global batch 128 (1024 over 8), the card's memory;
     2 x RTX4090 24GB base, large: global batch 512 (1024 over 2), machine.memory_gib=24.
   On CUDA at full scale, each sweep under a wall budget (25 minutes for all four by default; a
   sweep past its share is interrupted and keeps what it measured). On CPU (no CUDA, or --cpu) at
   reduced scale: widths / 16, vocabularies / 32, durations / 10, the card's memory / 256, the same
   global batches; those answers test the pipeline, not caiman-asr's table. Prints our pair beside the published one with
   its interval and confidence, and how the published pair itself measured.
Exits non-zero when the accounting check fails (the rows are reported, not gated: the GPU rows are
what the issue's target is about, and they need a GPU).
"""

from __future__ import annotations

import argparse
import csv
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

GIB = 1024**3


# --- 1. joint memory accounting -----------------------------------------------------------------


def live_bytes_mode():
    """A dispatch mode that counts the bytes of every CPU storage allocated under it while it lives."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, int] = {}
            self.current = self.peak = 0

        def _freed(self, key: int) -> None:
            self.current -= self.live.pop(key, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    storage = t.untyped_storage()
                    key = storage.data_ptr()
                    if key and key not in self.live:
                        self.live[key] = storage.nbytes()
                        self.current += storage.nbytes()
                        self.peak = max(self.peak, self.current)
                        weakref.finalize(storage, self._freed, key)
            return out

    return LiveBytes()


def joint_bytes_per_cell(vocab: int, joint: str, packed: bool, precision: str) -> float:
    """Bytes per lattice cell of one joint chunk's forward and backward (joint_and_loss), measured."""
    import torch

    from sweep.workloads.rnnt.config import RNNTWorkloadConfig
    from sweep.workloads.rnnt.fused import valid_cells
    from sweep.workloads.rnnt.model import RNNTWorkload

    cfg = RNNTWorkloadConfig(
        feat_dim=8, subsample=3, vocab=vocab, enc_hidden=64, enc_layers=1, pred_hidden=64, joint_hidden=64,
        joint=joint, packed_joint=packed, precision=precision, joint_chunk_mib=0.25,
    )
    workload = RNNTWorkload(cfg, torch.device("cpu"))
    points = []
    for frames in (16, 32, 48):
        gen = torch.Generator().manual_seed(frames)
        batch, tokens = 2, 8
        enc = torch.randn(batch, frames, cfg.enc_hidden, generator=gen).requires_grad_()
        pred = torch.randn(batch, tokens + 1, cfg.pred_hidden, generator=gen).requires_grad_()
        labels = torch.randint(1, vocab, (batch, tokens), generator=gen)
        frame_lens, label_lens = torch.tensor([frames, frames * 2 // 3]), torch.tensor([tokens, tokens // 2])
        cells = (len(valid_cells(frame_lens, label_lens, frames, tokens + 1)) if packed else batch * frames * (tokens + 1)) * vocab
        workload.model.zero_grad(set_to_none=True)
        with live_bytes_mode() as count:
            workload.joint_and_loss(enc, pred, labels, 1.0, frame_lens, label_lens)
        points.append((cells, count.peak))
    (c0, p0), (c2, p2) = points[0], points[-1]
    return (p2 - p0) / (c2 - c0)


def accounting() -> bool:
    import torch

    torch.set_num_threads(1)
    print("joint + loss memory per lattice cell (T x (U+1) x V), direct count of every storage allocated, CPU:")
    print(f"  {'vocab':>6}  {'precision':<9}  {'reference padded':>16}  {'fused padded':>12}  {'fused packed':>12}")
    ok = True
    for vocab in (8704, 17408):
        for precision in ("fp16", "fp32"):
            ref = joint_bytes_per_cell(vocab, "reference", False, precision)
            fused = joint_bytes_per_cell(vocab, "fused", False, precision)
            packed = joint_bytes_per_cell(vocab, "fused", True, precision)
            print(f"  {vocab:>6}  {precision:<9}  {ref:>16.2f}  {fused:>12.2f}  {packed:>12.2f}")
            limit = 2.5 if precision == "fp16" else 4.5
            ok &= fused <= limit and packed <= limit and (precision != "fp16" or ref >= 4 * fused)
    print(f"  check (fused <= 2.5 B under fp16, <= 4.5 B under fp32; reference >= 4x fused under fp16): {'pass' if ok else 'FAIL'}")
    return ok


# --- 2. caiman-asr's table ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    system: str
    model: str  # base | large
    machine: str  # the machine profile
    global_batch: int  # one rank's share of 1024
    memory_gib: float | None  # None: the card's
    published: tuple[int, int]  # (accum, split) at global batch 1024 on the whole system
    published_utt_s: float
    budget_share: float  # of the wall budget


ROWS = (
    Row("8xA100 80GB", "base", "a100x8", 128, None, (1, 8), 1400, 0.20),
    Row("8xA100 80GB", "large", "a100x8", 128, None, (1, 16), 700, 0.25),
    Row("2xRTX4090 24GB", "base", "rtx4090x2", 512, 24.0, (8, 8), 150, 0.25),
    Row("2xRTX4090 24GB", "large", "rtx4090x2", 512, 24.0, (16, 8), 45, 0.30),
)
# Trial settings: fewer timed steps than the default 32 (four sweeps in 30 minutes on one GPU),
# and the stress step kept at the last step every trial runs (warm-up 2 + measure_steps 6 - 1).
TRIAL = ["trial.measure_steps=6", "trial.max_measure_steps=12", "trial.time_limit_s=240", "workload.stress_step=7"]
# Reduced scale on CPU: activations and the joint's hidden layer shrink with the widths, the joint's
# output with the vocabulary; the memory budget by about as much (a heuristic: these rows check the
# pipeline, not caiman-asr's figures).
CPU_SCALE = {"width": 16, "vocab": 32, "duration": 10.0, "memory": 256}


def preset(model: str):
    from sweep.workloads.rnnt.config import RNNTWorkloadConfig

    conf = Path(__file__).resolve().parents[1] / "conf" / "workload" / f"rnnt_{model}.yaml"
    values = yaml.safe_load(conf.read_text())
    values.pop("defaults", None)
    return RNNTWorkloadConfig(**values)


def cpu_overrides(row: Row) -> list[str]:
    """The row at reduced scale: widths / 16, vocabulary / 32, durations / 10, the card's memory / 256."""
    full = preset(row.model)
    w, d = CPU_SCALE["width"], CPU_SCALE["duration"]
    small = replace(
        full, feat_dim=full.feat_dim // 4, enc_hidden=full.enc_hidden // w, pred_hidden=full.pred_hidden // w,
        joint_hidden=full.joint_hidden // w, vocab=full.vocab // CPU_SCALE["vocab"], duration_mean_s=full.duration_mean_s / d,
        duration_std_s=full.duration_std_s / d, min_duration_s=full.min_duration_s / d, max_duration_s=full.max_duration_s / d,
        corpus_utterances=20000,
    )
    fields = ("feat_dim", "enc_hidden", "pred_hidden", "joint_hidden", "vocab", "duration_mean_s", "duration_std_s",
              "min_duration_s", "max_duration_s", "corpus_utterances")
    card = row.memory_gib or 80.0
    return [
        f"workload=rnnt_{row.model}", *(f"workload.{f}={getattr(small, f):g}" for f in fields),
        f"global_batch_size={row.global_batch}", f"machine.memory_gib={card / CPU_SCALE['memory']:.4g}", *TRIAL,
    ]


def gpu_overrides(row: Row) -> list[str]:
    memory = [f"machine.memory_gib={row.memory_gib:g}"] if row.memory_gib else []
    return [f"+machine={row.machine}", "machine.num_devices=1", f"global_batch_size={row.global_batch}",
            f"workload=rnnt_{row.model}", *memory, *TRIAL]


def run_sweep(overrides: list[str], sweep_dir: Path, budget_s: float) -> tuple[int, float, bool]:
    """(exit code, wall seconds, interrupted): a real sweep, sent SIGINT once past its budget."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sweep", f"hydra.sweep.dir={sweep_dir}", "live=false", *overrides],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=sweep_dir.parent,
    )
    interrupted = False
    try:
        proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        interrupted = True
        proc.send_signal(signal.SIGINT)  # the sweep cancels what runs and keeps what finished
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    output = proc.stdout.read() if proc.stdout else ""
    (sweep_dir.parent / f"{sweep_dir.name}.log").write_text(output)
    return proc.returncode, time.monotonic() - t0, interrupted


def measured(sweep_dir: Path) -> tuple[dict | None, dict]:
    """(recommendation.yaml, trials.csv rows by (accum, split))."""
    rec_file, csv_file = sweep_dir / "recommendation.yaml", sweep_dir / "trials.csv"
    rec = yaml.safe_load(rec_file.read_text()) if rec_file.exists() else None
    rows = {(int(r["accum"]), int(r["split"])): r for r in csv.DictReader(csv_file.open())} if csv_file.exists() else {}
    return rec, rows


def describe_pair(row: dict | None) -> str:
    if row is None:
        return "not a candidate"
    status = row["status"] + (f" ({row['oom_phase']})" if row.get("oom_phase") else "")
    if row["status"] != "ok":
        return status
    tight = ", tight" if row.get("tight") == "True" else ""
    return (f"{float(row['throughput_samples_per_s']):.1f} [{float(row['throughput_low_samples_per_s']):.1f}, "
            f"{float(row['throughput_high_samples_per_s']):.1f}]{tight}")


def verdict(rec: dict | None, rows: dict, published: tuple[int, int]) -> str:
    if rec is None:
        return "no answer"
    ours = (rec["accum"], rec["split"])
    if ours == published:
        return "the published pair"
    pub = rows.get(published)
    if pub is None or pub["status"] != "ok" or not pub["throughput_low_samples_per_s"]:
        return f"differs; published pair {'not measured' if pub is None or pub['status'] in ('pending', 'skipped') else pub['status']}"
    low, high = rec["throughput_interval_samples_per_s"]
    overlap = float(pub["throughput_low_samples_per_s"]) <= high and low <= float(pub["throughput_high_samples_per_s"])
    return "inside the noise of the published pair" if overlap else "differs beyond the noise"


def table(on_cuda: bool, budget_s: float, root: Path) -> None:
    scale = "full scale, one device" if on_cuda else "reduced scale on CPU (pipeline check, not caiman-asr's figures)"
    print(f"\ncaiman-asr's table, one rank's share on one device, {scale}:")
    lines = []
    for row in ROWS:
        sweep_dir = root / f"{row.machine}_{row.model}"
        overrides = gpu_overrides(row) if on_cuda else cpu_overrides(row)
        code, wall, interrupted = run_sweep(overrides, sweep_dir, budget_s * row.budget_share)
        rec, rows = measured(sweep_dir)
        ours = "none" if rec is None else (
            f"{rec['accum']}/{rec['split']}: {rec['throughput_samples_per_s']:.1f} samples/s "
            f"[{rec['throughput_interval_samples_per_s'][0]:.1f}, {rec['throughput_interval_samples_per_s'][1]:.1f}], "
            f"confidence {rec['confidence']}"
        )
        ran = sum(1 for r in rows.values() if r["wall_s"])
        note = f"{ran} trials, {wall:.0f} s" + (", interrupted at its budget" if interrupted else "") + (f", exit {code}" if code not in (0, 130) else "")
        lines.append((row, ours, describe_pair(rows.get(row.published)), verdict(rec, rows, row.published), note))
        print(f"  {row.system} {row.model}: published {row.published[0]}/{row.published[1]} ({row.published_utt_s:g} utt/s on the system); "
              f"ours {ours}; published pair measured: {describe_pair(rows.get(row.published))}; {verdict(rec, rows, row.published)} ({note})",
              flush=True)
    print("\n| system | model | published accum/split | ours (samples/s, 95% interval, confidence) | published pair as measured | verdict |")
    print("|---|---|---|---|---|---|")
    for row, ours, pub, judged, note in lines:
        print(f"| {row.system} | {row.model} | {row.published[0]}/{row.published[1]} | {ours} | {pub} | {judged} ({note}) |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the reduced-scale CPU rows even where CUDA exists")
    parser.add_argument("--budget-min", type=float, default=None, help="wall budget for the four sweeps (default 25 on CUDA, 12 on CPU)")
    parser.add_argument("--keep", type=Path, default=None, help="put the sweep dirs here instead of a temporary dir")
    args = parser.parse_args()
    import torch

    on_cuda = torch.cuda.is_available() and not args.cpu
    ok = accounting()
    budget_s = 60 * (args.budget_min or (25.0 if on_cuda else 12.0))
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        table(on_cuda, budget_s, args.keep.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="bench_caiman_") as tmp:
            table(on_cuda, budget_s, Path(tmp))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
