"""The fused RNN-T loss: caiman-asr's joint memory (workload.joint=fused).

The reference joint ends in log_softmax, so a chunk holds the joint's logits, an
fp32 copy of the log-probs and, in the backward, an fp32 gradient of those and a
gradient of the logits: about 10-12 bytes per lattice cell (T x (U+1) x V) under
fp16 autocast. caiman-asr's loss (a fork of apex's transducer loss) takes the fp16
logits as they are, computes the log-softmax normaliser itself, and its backward
fuses the softmax backward, writing the gradient where the logits were. This
module does the same in PyTorch:

* forward: per cell, the normaliser log-sum-exp_v(logit) and the blank and label
  logits, computed in row chunks so that no fp32 temporary is the full lattice;
  then the alpha recursion on those (B, T, U+1) figures (loss.lattice_alpha);
* backward: per cell, d NLL / d logit_v = g * (softmax_v * occupancy - blank and
  label edge occupancies), again chunk by chunk, written into the logits' own
  buffer, which is returned as their gradient. So the logits are the only tensor
  of lattice size: 2 bytes per cell under fp16, 4 under fp32.

The logits' contents are destroyed by the backward (they become the gradient):
whatever produced them must not need them again (a Linear does not), and the graph
can be run backward once.

Packed: the logits may hold only each utterance's valid T_b x (U_b+1) cells, as
rows of a (N, V) tensor (apex's TransducerJoint(pack_output=True)); `cells` gives
each row's position in the padded (B, T, U+1) lattice. Padded is the special case
where every cell is a row.

No Triton kernel: this host has no GPU to tune one on, and the chunked PyTorch
already keeps the memory; a fused kernel would save time, not bytes.
"""

from __future__ import annotations

import torch

from sweep.workloads.rnnt.loss import BLANK, edge_occupancy, lattice_alpha

DEFAULT_CHUNK_BYTES = 64 * 1024**2  # fp32 temporaries per chunk: small beside any joint worth fusing
# At most this many chunks per lattice, whatever chunk_bytes says: each chunk launches about a dozen
# kernels, and at caiman-asr's base size a 64 MiB chunk would cut one joint chunk of 16 utterances
# into 190 pieces (some 2,500 launches, a quarter of a GPU step by our estimate). 64 chunks keep the
# fp32 temporaries (about 3 chunks at once) under a tenth of the fp16 logits.
MAX_CHUNKS = 64


def valid_cells(frame_lens: torch.Tensor, label_lens: torch.Tensor, T: int, U1: int) -> torch.Tensor:
    """Flat (b, t, u) lattice positions, b*T*U1 + t*U1 + u, of every utterance's valid cells, in order."""
    t = torch.arange(T, device=frame_lens.device)
    u = torch.arange(U1, device=frame_lens.device)
    valid = (t[None, :, None] < frame_lens[:, None, None]) & (u[None, None, :] <= label_lens[:, None, None])
    return valid.flatten().nonzero().squeeze(1)


def _chunk_rows(rows: int, vocab: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // (4 * vocab), -(-rows // MAX_CHUNKS))


class _FusedRNNTLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, lattice, cells, ends, chunk_bytes):
        B, T, U1 = lattice
        V = logits.shape[-1]
        rows = logits.detach().view(-1, V)
        n = rows.shape[0]
        cells = torch.arange(n, device=rows.device) if cells is None else cells
        # The label each cell emits: labels[b, u], and blank at u = U (no emission leaves the last column).
        next_label = torch.cat([labels, labels.new_full((B, 1), BLANK)], dim=1).reshape(-1)
        row_label = next_label[(cells // (T * U1)) * U1 + cells % U1]
        # fp32 at least: half-precision logits are summed in fp32; float64 (the tests) stays float64.
        acc = torch.promote_types(rows.dtype, torch.float32)
        log_norm = torch.empty(n, device=rows.device, dtype=acc)
        step = _chunk_rows(n, V, chunk_bytes)
        with torch.autocast(rows.device.type, enabled=False):
            for s in range(0, n, step):
                log_norm[s : s + step] = torch.logsumexp(rows[s : s + step].to(acc), dim=1)
            blank_rows = rows[:, BLANK].to(acc) - log_norm
            emit_rows = rows.gather(1, row_label[:, None]).squeeze(1).to(acc) - log_norm
            # The lattice figures, V times smaller than the logits: padding cells hold log-prob 0 (finite,
            # never read by the utterance they pad).
            blank_lp = log_norm.new_zeros(B * T * U1).index_copy_(0, cells, blank_rows).view(B, T, U1)
            emit_lp = log_norm.new_zeros(B * T * U1).index_copy_(0, cells, emit_rows).view(B, T, U1)[:, :, :-1]
            csum = torch.cat([emit_lp.new_zeros(B, T, 1), emit_lp.cumsum(2)], dim=2)
            alpha, log_z, t_end, u_end = lattice_alpha(blank_lp, csum, ends)
        ctx.save_for_backward(logits, log_norm, cells, row_label, blank_lp, emit_lp, csum, alpha, log_z, t_end, u_end)
        ctx.padded, ctx.chunk_bytes = ends is not None, chunk_bytes
        return -log_z

    @staticmethod
    def backward(ctx, grad_nll):
        logits, log_norm, cells, row_label, blank_lp, emit_lp, csum, alpha, log_z, t_end, u_end = ctx.saved_tensors
        B, T, U1 = blank_lp.shape
        V = logits.shape[-1]
        occ_blank, occ_emit = edge_occupancy(blank_lp, emit_lp, csum, alpha, log_z, t_end, u_end, ctx.padded)
        # d NLL / d logit_v = g * (softmax_v * (blank + emission occupancy) - blank occupancy [v = blank]
        #                          - emission occupancy [v = label]), per cell.
        weight = grad_nll.to(log_norm.dtype)[cells // (T * U1)]
        occ_blank = occ_blank.reshape(-1)[cells] * weight
        occ_emit = torch.cat([occ_emit, occ_emit.new_zeros(B, T, 1)], dim=2).reshape(-1)[cells] * weight
        occ_node = occ_blank + occ_emit
        rows = logits.detach().view(-1, V)  # the buffer the gradient is written into
        step = _chunk_rows(rows.shape[0], V, ctx.chunk_bytes)
        for s in range(0, rows.shape[0], step):
            e = min(s + step, rows.shape[0])
            grad = torch.exp(rows[s:e].to(log_norm.dtype) - log_norm[s:e, None]).mul_(occ_node[s:e, None])
            grad[:, BLANK] -= occ_blank[s:e]
            grad.scatter_add_(1, row_label[s:e, None], -occ_emit[s:e, None])
            rows[s:e] = grad
        return logits, None, None, None, None, None


def fused_rnnt_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    frame_lens: torch.Tensor | None = None,
    label_lens: torch.Tensor | None = None,
    cells: torch.Tensor | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """Per-utterance NLL, shape (B,), from the joint's logits (no log_softmax in front).

    Padded: logits (B, T, U+1, V). Packed: logits (N, V), the rows `cells` names (valid_cells),
    with frame_lens and label_lens required. The backward overwrites `logits` with its gradient.
    """
    B, U = labels.shape
    if logits.dim() == 4:
        _, T, U1, _ = logits.shape
    else:
        if cells is None or frame_lens is None or label_lens is None:
            raise ValueError("packed logits (N, V) need cells, frame_lens and label_lens")
        T, U1 = int(frame_lens.max()), U + 1
    ends = None
    if frame_lens is not None or label_lens is not None:
        frame_lens = torch.full((B,), T) if frame_lens is None else frame_lens
        label_lens = torch.full((B,), U1 - 1) if label_lens is None else label_lens
        ends = (frame_lens.long() - 1, label_lens.long())
    return _FusedRNNTLoss.apply(logits, labels, (B, T, U1), cells, ends, int(chunk_bytes))
