"""A real RNN-T training step with gradient accumulation and batch splitting.

The step follows Myrtle's recipe: the encoder and prediction networks run on
the whole per-device micro-batch; their outputs are cut from the graph and the
joint network + loss (whose 4-D output dominates memory) run on `split`
chunks, each chunk's backward accumulating into the cut outputs' gradients;
then one backward through the encoder and prediction networks. Gradients
accumulate over `accum` micro-batches, then one optimizer step.

Losses are summed per utterance and divided by the rank's samples per step;
DistributedDataParallel averages over ranks, so the gradient is the same for
every (accum, split, num_devices) at a fixed global batch: the sweep compares
speed, never a different training run.

Method names are part of the interface: OOM classification from logs reads
the traceback's function names (`encode`, `predict`, `joint_and_loss`,
`backward_encoder`, `optimizer_step`).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sweep.core.schema import PHASE_ENCODER, PHASE_JOINT, PHASE_OPTIMIZER
from sweep.workloads.rnnt.config import check_joint, check_precision
from sweep.workloads.rnnt.fused import fused_rnnt_loss, valid_cells
from sweep.workloads.rnnt.loss import BLANK, rnnt_loss, rnnt_loss_bruteforce  # noqa: F401 - model's public names
from sweep.workloads.rnnt.memory import DeviceOOM, drop_exception, free_device_memory, is_oom_error, oom_summary
from sweep.workloads.rnnt.synthetic import SyntheticData  # noqa: F401 - model's public names

# Status codes all ranks exchange before any gradient traffic. MAX picks the
# one every rank reports, so a real bug (FAILED) outranks an OOM.
_OK, _FAILED = 0, 4
_PHASE_CODE: dict[str, int] = {PHASE_ENCODER: 1, PHASE_JOINT: 2, PHASE_OPTIMIZER: 3}  # phases are OomPhase, a str
_CODE_PHASE = {v: k for k, v in _PHASE_CODE.items()}


# ---------------------------------------------------------------- model


class RNNT(nn.Module):
    """caiman-asr's RNN-T shape: frontend frame stacking, pre-LSTM, time stacking, post-LSTM;
    an embedding + LSTM prediction network; an additive joint. The CPU default has no pre-LSTM
    (enc_pre_layers=0, enc_stack_time=1): one encoder LSTM after the frontend stacking."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.subsample, self.stack_time = int(cfg.subsample), int(cfg.enc_stack_time)
        frontend = cfg.feat_dim * cfg.subsample
        self.encoder_pre = (
            nn.LSTM(frontend, cfg.enc_hidden, num_layers=cfg.enc_pre_layers, batch_first=True) if cfg.enc_pre_layers > 0 else None
        )
        post_in = (cfg.enc_hidden if self.encoder_pre is not None else frontend) * self.stack_time
        self.encoder = nn.LSTM(post_in, cfg.enc_hidden, num_layers=cfg.enc_layers, batch_first=True)
        self.embed = nn.Embedding(cfg.vocab, cfg.pred_hidden)
        self.pred_rnn = nn.LSTM(cfg.pred_hidden, cfg.pred_hidden, num_layers=cfg.pred_layers, batch_first=True)
        self.joint_enc = nn.Linear(cfg.enc_hidden, cfg.joint_hidden)
        self.joint_pred = nn.Linear(cfg.pred_hidden, cfg.joint_hidden)
        self.joint_out = nn.Linear(cfg.joint_hidden, cfg.vocab)

    @staticmethod
    def _stack(x: torch.Tensor, factor: int) -> torch.Tensor:
        B, T, F = x.shape
        T = T - T % factor  # stacking drops the ragged tail
        return x[:, :T].reshape(B, T // factor, F * factor)

    def encoder_forward(self, feats: torch.Tensor) -> torch.Tensor:
        x = self._stack(feats, self.subsample)
        if self.encoder_pre is not None:
            x = self.encoder_pre(x)[0]
        if self.stack_time > 1:
            x = self._stack(x, self.stack_time)
        return self.encoder(x)[0]

    def prediction_forward(self, labels: torch.Tensor) -> torch.Tensor:
        blank_prefixed = torch.cat([labels.new_full((labels.shape[0], 1), BLANK), labels], dim=1)
        return self.pred_rnn(self.embed(blank_prefixed))[0]

    def forward(self, enc: torch.Tensor, pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What DistributedDataParallel calls: a micro-batch's encoder and prediction outputs, unchanged.

        The joint is cut off from the encoder (each chunk runs its own backward), so the backward
        DDP must arm is the encoder's, which starts from these tensors; passing them through DDP's
        forward, once the joint is done, lets every rank agree on an OOM before any gradient moves.
        """
        return enc, pred

    def joint_logits(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """The joint's output before any softmax, padded: (B, T, U+1, V)."""
        hidden = self.joint_enc(enc)[:, :, None, :] + self.joint_pred(pred)[:, None, :, :]  # (B, T, U+1, H)
        return self.joint_out(torch.tanh(hidden))

    def joint_logits_packed(self, enc: torch.Tensor, pred: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """The joint's output at the lattice cells `cells` only (fused.valid_cells): (N, V). The hidden
        layer is gathered per cell too, so nothing of padded lattice size is made."""
        B, T, _ = enc.shape
        U1 = pred.shape[1]
        b, t, u = cells // (T * U1), (cells // U1) % T, cells % U1
        hidden = self.joint_enc(enc).reshape(B * T, -1)[b * T + t] + self.joint_pred(pred).reshape(B * U1, -1)[b * U1 + u]
        return self.joint_out(torch.tanh(hidden))

    def joint_forward(self, enc: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """The reference joint: log-probs (B, T, U+1, V)."""
        return torch.log_softmax(self.joint_logits(enc, pred), dim=-1)


def cpu_bf16_supported() -> bool:
    """Whether oneDNN has bfloat16 kernels on this CPU: without them (an AVX2-only CPU) the LSTM
    under bf16 autocast fails with "could not create a primitive descriptor"."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else True


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for workload.precision on this device; None for fp32."""
    check_precision(precision)
    device = torch.device(device)
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision in ("auto", "fp16"):
        return torch.float16
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"workload.precision=bf16 is not supported by {torch.cuda.get_device_name(device)}: use fp16 or fp32")
    if device.type == "cpu" and not cpu_bf16_supported():
        raise ValueError(
            f"workload.precision=bf16 needs a CPU whose oneDNN has bfloat16 kernels (AVX-512 BF16 or AMX; this one "
            f"has {torch.backends.cpu.get_cpu_capability()}): its LSTM cannot run in bf16 here; use fp32"
        )
    return torch.bfloat16


# ---------------------------------------------------------------- workload


@dataclass
class _Failure:
    """What went wrong on this rank inside a guarded region."""

    code: int
    message: str
    traceback_text: str = ""
    error: BaseException | None = None  # a non-OOM exception, re-raised as is on its own rank


class RNNTWorkload:
    """The RNN-T model, optimizer and synthetic data of one rank."""

    def __init__(
        self, cfg, device: torch.device, rank: int = 0, world_size: int = 1, data_seed: int | None = None
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.rank, self.world_size = rank, world_size
        torch.manual_seed(cfg.seed)  # same init on every rank, so no broadcast is needed
        self.model = RNNT(cfg).to(self.device)
        # Several ranks: DDP all-reduces gradient buckets while the last micro-batch's backward runs
        # (no_sync() on the others). The joint's parameters are not in that backward's graph (their
        # gradients were accumulated chunk by chunk), so DDP must be told to look for them.
        self.ddp: nn.parallel.DistributedDataParallel | None = None
        if world_size > 1:
            self.ddp = nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=True,
                broadcast_buffers=False,
            )
        self.data = SyntheticData(cfg, cfg.seed if data_seed is None else data_seed, self.device)
        self.optimizer: torch.optim.Optimizer
        if cfg.optimizer == "adam":
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        elif cfg.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.0)
        else:
            raise ValueError(f"workload.optimizer={cfg.optimizer!r} is not valid: expected 'adam' or 'sgd'")
        check_joint(cfg.joint, bool(cfg.packed_joint))
        self.amp_dtype = autocast_dtype(cfg.precision, self.device)
        # fp16 gradients underflow without loss scaling (the recipe's GradScaler); bf16 and fp32 need none.
        self.scaler = torch.amp.GradScaler(self.device.type) if self.amp_dtype == torch.float16 else None
        self._phase: str | None = None
        # Called with the new phase on every change; memory tests hang peak resets on it.
        self.on_phase: Callable[[str | None], None] | None = None
        # Told of each OOM this workload catches, while its traceback still holds the failing call's
        # frames (the runner passes it to the probe, which names the module from them).
        self.on_oom: Callable[[BaseException], None] | None = None

    @property
    def phase(self) -> str | None:
        """The part of the step in progress: PHASE_ENCODER, PHASE_JOINT, PHASE_OPTIMIZER or None."""
        return self._phase

    @phase.setter
    def phase(self, value: str | None) -> None:
        self._phase = value
        if self.on_phase is not None:
            self.on_phase(value)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # -- the pieces of one micro-batch (names read by log-based OOM classification)

    def encode(self, feats: torch.Tensor) -> torch.Tensor:
        return self.model.encoder_forward(feats)

    def predict(self, labels: torch.Tensor) -> torch.Tensor:
        return self.model.prediction_forward(labels)

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def joint_and_loss(
        self, enc: torch.Tensor, pred: torch.Tensor, labels: torch.Tensor, scale: float, frame_lens=None, label_lens=None
    ) -> torch.Tensor:
        """Joint + loss forward and backward for one chunk; returns the chunk's (scaled) loss, detached."""
        if self.cfg.joint == "fused":
            loss = self._fused_joint_loss(enc, pred, labels, frame_lens, label_lens).sum() * scale
        else:
            with self._autocast():
                log_probs = self.model.joint_forward(enc, pred)
            loss = rnnt_loss(log_probs.float(), labels, frame_lens=frame_lens, label_lens=label_lens).sum() * scale
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        return loss.detach()

    def _fused_joint_loss(self, enc, pred, labels, frame_lens, label_lens) -> torch.Tensor:
        """caiman-asr's joint memory: logits at the amp dtype, packed if asked, and the fused loss that
        overwrites them with their gradient (fused.py)."""
        chunk_bytes = int(float(self.cfg.joint_chunk_mib) * 1024**2)
        if self.cfg.packed_joint and frame_lens is not None:
            frame_lens, label_lens = frame_lens.to(self.device), label_lens.to(self.device)
            cells = valid_cells(frame_lens, label_lens, enc.shape[1], pred.shape[1])
            with self._autocast():
                logits = self.model.joint_logits_packed(enc, pred, cells)
            return fused_rnnt_loss(logits, labels, frame_lens, label_lens, cells=cells, chunk_bytes=chunk_bytes)
        with self._autocast():
            logits = self.model.joint_logits(enc, pred)
        return fused_rnnt_loss(logits, labels, frame_lens, label_lens, chunk_bytes=chunk_bytes)

    def backward_encoder(
        self, enc: torch.Tensor, pred: torch.Tensor, enc_grad: torch.Tensor | None, pred_grad: torch.Tensor | None, sync: bool = False
    ) -> None:
        """The encoder and prediction backward; with sync (the last micro-batch), DDP all-reduces every
        gradient (accumulated over all micro-batches) bucket by bucket while it runs."""
        self.phase = PHASE_ENCODER
        if self.ddp is None:
            torch.autograd.backward([enc, pred], [enc_grad, pred_grad])
            return
        with contextlib.nullcontext() if sync else self.ddp.no_sync():
            enc, pred = self.ddp(enc, pred)
            torch.autograd.backward([enc, pred], [enc_grad, pred_grad])

    def optimizer_step(self) -> None:
        # Gradients are all-reduced already: DDP did it during the last micro-batch's backward.
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # unscales; skips the step on inf/nan, as the recipe does
            self.scaler.update()
        else:
            self.optimizer.step()

    def micro_batch(
        self, per_device_batch: int, accum: int, split: int, step_index: int, micro_index: int, sync: bool = False
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch, gradients added to .grad; returns its loss.

        sync: all-reduce the accumulated gradients during this backward (the last micro-batch).
        """
        enc, pred, enc_grad, pred_grad, loss = self.forward_and_joint(per_device_batch, accum, split, step_index, micro_index)
        self.backward_encoder(enc, pred, enc_grad, pred_grad, sync=sync)
        return loss

    def forward_and_joint(
        self, per_device_batch: int, accum: int, split: int, step_index: int, micro_index: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """A micro-batch up to its encoder backward: (enc, pred, their gradients, loss)."""
        global_batch = per_device_batch * accum * self.world_size
        first = (self.rank * accum + micro_index) * per_device_batch  # each rank takes a contiguous share
        feats, labels, frame_lens, label_lens = self.data.padded_batch(step_index, first, per_device_batch, global_batch)
        # The mean over this rank's samples: DDP's all-reduce averages over ranks, giving the global mean.
        scale = 1.0 / (per_device_batch * accum)
        self.phase = PHASE_ENCODER
        with self._autocast():
            enc, pred = self.encode(feats), self.predict(labels)
        # Cut here: each joint chunk's backward stops at these leaves and adds into their .grad.
        enc_cut, pred_cut = enc.detach().requires_grad_(), pred.detach().requires_grad_()
        self.phase = PHASE_JOINT
        joint_batch = per_device_batch // split
        loss = torch.zeros((), device=self.device)
        for c in range(split):
            chunk = slice(c * joint_batch, (c + 1) * joint_batch)
            if frame_lens is None:
                loss += self.joint_and_loss(enc_cut[chunk], pred_cut[chunk], labels[chunk], scale)
                continue
            # A chunk is padded to its own longest utterance, not the micro-batch's.
            T, U = int(frame_lens[chunk].max()), int(label_lens[chunk].max())
            loss += self.joint_and_loss(
                enc_cut[chunk, :T], pred_cut[chunk, : U + 1], labels[chunk, :U], scale, frame_lens[chunk], label_lens[chunk]
            )
        return enc, pred, enc_cut.grad, pred_cut.grad, loss

    # -- whole steps

    def warm_up(self, per_device_batch: int = 1) -> None:
        """Forward and backward at this per-device batch, no optimizer step.

        Threads, lazily loaded kernels and shape-specialised oneDNN primitives
        (the CPU LSTM) come up now, before a memory baseline is taken: created
        later, under an emulated CPU budget, the primitives fail with
        "could not create a primitive" rather than an allocator error. Chunks
        of one sample keep the joint's share small.
        """
        self.micro_batch(per_device_batch, 1, per_device_batch, step_index=0, micro_index=0, sync=False)
        self.model.zero_grad(set_to_none=True)
        self.phase = None

    def train_step(self, per_device_batch: int, accum: int, split: int, step_index: int) -> None:
        """One optimizer step over the global batch. Raises DeviceOOM (the same on every rank) on OOM."""
        self._accumulate(per_device_batch, accum, split, step_index)
        self.phase = PHASE_OPTIMIZER
        self._all_ranks_or_raise(self._guard(self.optimizer_step))
        self.phase = None

    def gradients(self, per_device_batch: int, accum: int, split: int, step_index: int = 0) -> dict[str, torch.Tensor]:
        """The (all-reduced) gradient one step would apply, without applying it; for equivalence tests."""
        self._accumulate(per_device_batch, accum, split, step_index)
        grads = {}
        for name, p in self.model.named_parameters():
            if p.grad is None:
                raise RuntimeError(f"{name}: no gradient (no micro-batch reached it)")
            grads[name] = p.grad.detach().clone()
        self.phase = None
        return grads

    def _accumulate(self, per_device_batch: int, accum: int, split: int, step_index: int) -> None:
        if per_device_batch < 1 or split < 1 or per_device_batch % split:
            raise ValueError(f"per_device_batch={per_device_batch} is not a positive multiple of split={split}")
        self.model.zero_grad(set_to_none=True)

        last: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []

        def up_to_the_last_backward() -> None:
            for m in range(accum - 1):
                self.micro_batch(per_device_batch, accum, split, step_index, m, sync=False)
            last.append(self.forward_and_joint(per_device_batch, accum, split, step_index, accum - 1)[:4])

        # Every rank reports before any gradient traffic, so a rank that ran out of memory (or broke)
        # in a forward or a joint cannot leave the others waiting in an all-reduce. The last encoder
        # backward then all-reduces as it goes; an OOM inside it on one rank alone is not agreed on.
        self._all_ranks_or_raise(self._guard(up_to_the_last_backward))
        self._all_ranks_or_raise(self._guard(lambda: self.backward_encoder(*last.pop(), sync=True)))

    def _guard(self, fn: Callable[[], None]) -> _Failure | None:
        """Run fn; turn an exception into a _Failure with the big tensors it pinned released."""
        try:
            fn()
            return None
        except Exception as exc:  # noqa: BLE001 - sorted below: OOM vs anything else
            if not is_oom_error(exc):
                return _Failure(_FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0], error=exc)
            phase = self.phase or PHASE_ENCODER
            failure = _Failure(_PHASE_CODE[phase], oom_summary(exc), "".join(traceback.format_exception(exc)))
            if self.on_oom is not None:
                self.on_oom(exc)
            drop_exception(exc)
        # Out of the except block: the traceback's frames (and the activations they
        # held) are unreachable now, so this actually frees them.
        self.model.zero_grad(set_to_none=True)
        free_device_memory(self.device)
        return failure

    def _all_ranks_or_raise(self, failure: _Failure | None) -> None:
        code, first_rank, message = (failure.code if failure else _OK), self.rank, failure.message if failure else ""
        if self.world_size > 1:
            comm = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
            status = torch.tensor([code], device=comm)
            dist.all_reduce(status, op=dist.ReduceOp.MAX)
            if int(status.item()) == _OK:
                return
            reports: list[Any] = [None] * self.world_size  # all_gather_object puts each rank's (code, message) here
            dist.all_gather_object(reports, (code, message))
            code = int(status.item())
            first_rank = next(r for r, (c, _) in enumerate(reports) if c == code)
            message = reports[first_rank][1]
        if code == _OK:
            return
        if failure is not None and failure.error is not None and code == _FAILED:
            raise failure.error
        if code == _FAILED:
            raise RuntimeError(f"rank {first_rank} failed: {message}")
        phase = _CODE_PHASE[code]
        self.phase = phase
        tb = failure.traceback_text if failure is not None and first_rank == self.rank else ""
        raise DeviceOOM(phase, f"{message} in phase {phase}", rank=first_rank, traceback_text=tb)
