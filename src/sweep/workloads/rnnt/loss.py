"""The RNN-T loss: per-utterance NLL by forward variables, its gradient by backward variables,
and a brute-force reference for tests (the built-in workload's loss, split out of model.py)."""

from __future__ import annotations

import itertools

import torch

BLANK = 0


def _lattice(log_probs: torch.Tensor, labels: torch.Tensor, blank: int):
    """Blank and emission log-probs on the lattice, and C(t,u) = sum_{j<u} emit(t,j)."""
    B, T, U1, _ = log_probs.shape
    blank_lp = log_probs[..., blank]  # (B, T, U+1)
    index = labels[:, None, :, None].expand(B, T, U1 - 1, 1)
    emit_lp = log_probs[:, :, :-1, :].gather(3, index).squeeze(3)  # (B, T, U)
    csum = torch.cat([log_probs.new_zeros(B, T, 1), emit_lp.cumsum(2)], dim=2)  # (B, T, U+1)
    return blank_lp, emit_lp, csum


def lattice_alpha(blank_lp: torch.Tensor, csum: torch.Tensor, ends=None):
    """Forward variables alpha (B, T, U+1), log Z (B,) and each utterance's last cell (t_end, u_end).

    Within a lattice row, emissions form a linear recurrence in log space,
    solved in one shot by a cumulative sum and a log-cumsum-exp along u:

        alpha(t,u) = C(t,u) + logcumsumexp_u[alpha(t-1,u) + blank(t-1,u) - C(t,u)]

    Carrying a(t) = alpha(t) - C(t) leaves two ops per time step; everything
    else is computed for all t at once. The loop over t is the only sequential
    part, and it is the per-chunk cost of batch splitting, so it is kept minimal.
    """
    B, T, U1 = blank_lp.shape
    k = (csum[:, :-1] + blank_lp[:, :-1] - csum[:, 1:]).unbind(1)
    rows = [blank_lp.new_zeros(B, U1)]  # t = 0: alpha(0) = C(0), emissions only
    for t in range(1, T):
        rows.append(torch.logcumsumexp(rows[-1] + k[t - 1], dim=1))
    alpha = torch.stack(rows, dim=1) + csum
    # Padding lies after each utterance's last frame and token, so alpha up to
    # (T_b - 1, U_b) never reads it: the utterance ends where its lengths say.
    t_end, u_end = ends if ends is not None else (torch.full((B,), T - 1), torch.full((B,), U1 - 1))
    t_end, u_end = t_end.to(alpha.device), u_end.to(alpha.device)
    batch = torch.arange(B, device=alpha.device)
    log_z = alpha[batch, t_end, u_end] + blank_lp[batch, t_end, u_end]
    return alpha, log_z, t_end, u_end


def edge_occupancy(blank_lp, emit_lp, csum, alpha, log_z, t_end, u_end, padded: bool):
    """The probability that an alignment passes each blank edge (B, T, U+1) and each emission edge (B, T, U):
    -d(NLL)/d(edge's log-prob), by backward variables. Zero outside each utterance."""
    B, T, U1 = blank_lp.shape
    # Backward variables, the mirror image: b(t) = beta(t) + C(t) obeys
    # b(t) = reverse-logcumsumexp_u[b(t+1) + C(t) - C(t+1) + blank(t)], so the
    # rows are flipped in u once, up front, and flipped back once at the end.
    kb = (csum[:, :-1] - csum[:, 1:] + blank_lp[:, :-1]).flip(2).unbind(1)
    batch = torch.arange(B, device=blank_lp.device)
    end_value = (blank_lp[batch, t_end, u_end] + csum[batch, t_end, u_end])[:, None].expand(B, U1)
    if not padded:
        rows = [end_value]
        for t in range(T - 2, -1, -1):
            rows.append(torch.logcumsumexp(rows[-1] + kb[t], dim=1))
    else:
        # Each utterance starts its backward recursion at its own last frame, with
        # -inf past its last token (flipped: before index U1-1-U_b) and after its last frame.
        neg_inf = blank_lp.new_tensor(float("-inf"))
        past_last_token = torch.arange(U1, device=blank_lp.device)[None, :] < (U1 - 1 - u_end)[:, None]
        start = end_value.masked_fill(past_last_token, float("-inf"))
        rows = [torch.where((t_end == T - 1)[:, None], start, neg_inf)]
        for t in range(T - 2, -1, -1):
            step = torch.logcumsumexp(rows[-1] + kb[t], dim=1)
            rows.append(torch.where((t_end == t)[:, None], start, torch.where((t_end > t)[:, None], step, neg_inf)))
    beta = torch.stack(rows[::-1], dim=1).flip(2) - csum
    occ_blank = torch.zeros_like(blank_lp)
    occ_blank[:, :-1] = torch.exp(alpha[:, :-1] + blank_lp[:, :-1] + beta[:, 1:] - log_z[:, None, None])
    occ_blank[batch, t_end, u_end] = 1.0
    occ_emit = torch.exp(alpha[:, :, :-1] + emit_lp + beta[:, :, 1:] - log_z[:, None, None])
    return occ_blank, occ_emit


class _RNNTLoss(torch.autograd.Function):
    """NLL by forward variables, gradient by backward variables (the alpha-beta method), on
    log-probs (the reference joint: log_softmax in front). Its backward is written out rather
    than taped op by op, so the per-chunk cost of batch splitting stays small."""

    @staticmethod
    def forward(ctx, log_probs: torch.Tensor, labels: torch.Tensor, blank: int, ends=None) -> torch.Tensor:
        blank_lp, emit_lp, csum = _lattice(log_probs.detach(), labels, blank)
        alpha, log_z, t_end, u_end = lattice_alpha(blank_lp, csum, ends)
        ctx.save_for_backward(labels, blank_lp, emit_lp, csum, alpha, log_z, t_end, u_end)
        ctx.blank, ctx.shape, ctx.padded = blank, log_probs.shape, ends is not None
        return -log_z

    @staticmethod
    def backward(ctx, grad_nll: torch.Tensor):
        labels, blank_lp, emit_lp, csum, alpha, log_z, t_end, u_end = ctx.saved_tensors
        B, T, U1 = blank_lp.shape
        occ_blank, occ_emit = edge_occupancy(blank_lp, emit_lp, csum, alpha, log_z, t_end, u_end, ctx.padded)
        scale = -grad_nll[:, None, None]
        grad = blank_lp.new_zeros(ctx.shape)
        grad[..., ctx.blank] = occ_blank * scale
        index = labels[:, None, :, None].expand(B, T, U1 - 1, 1)
        grad[:, :, :-1, :].scatter_(3, index, (occ_emit * scale).unsqueeze(3))
        return grad, None, None, None


def rnnt_loss(
    log_probs: torch.Tensor,
    labels: torch.Tensor,
    blank: int = BLANK,
    frame_lens: torch.Tensor | None = None,
    label_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-utterance negative log-likelihood, shape (B,).

    log_probs: (B, T, U+1, V) log-softmax output of the joint; labels: (B, U) in 1..V-1.
    frame_lens, label_lens: (B,) lengths of padded utterances (T_b <= T, U_b <= U);
    None means every utterance fills the tensor. Padded cells get zero gradient.
    """
    if frame_lens is None and label_lens is None:
        return _RNNTLoss.apply(log_probs, labels, blank, None)
    B, T, U1, _ = log_probs.shape
    frame_lens = torch.full((B,), T) if frame_lens is None else frame_lens
    label_lens = torch.full((B,), U1 - 1) if label_lens is None else label_lens
    return _RNNTLoss.apply(log_probs, labels, blank, (frame_lens.long() - 1, label_lens.long()))


def rnnt_loss_bruteforce(log_probs: torch.Tensor, labels: torch.Tensor, blank: int = BLANK) -> torch.Tensor:
    """The same NLL by enumerating every alignment; exponential, for tests on tiny inputs."""
    B, T, U1, _ = log_probs.shape
    U = U1 - 1
    out = []
    for b in range(B):
        paths = []
        # An alignment is T-1+U moves from (0,0) to (T-1,U): U emissions, T-1 blanks,
        # then the final blank at (T-1, U).
        for emits in itertools.combinations(range(T - 1 + U), U):
            t = u = 0
            score = log_probs.new_zeros(())
            for move in range(T - 1 + U):
                if move in emits:
                    score = score + log_probs[b, t, u, labels[b, u]]
                    u += 1
                else:
                    score = score + log_probs[b, t, u, blank]
                    t += 1
            paths.append(score + log_probs[b, T - 1, U, blank])
        out.append(-torch.logsumexp(torch.stack(paths), dim=0))
    return torch.stack(out)
