"""Reference answers for appendix 04c (CPU fast paths). Shown only when the learner asks."""
import torch

from refimpl import drafts


def break_even_v(alpha, gamma, c):
    """speedup = tau / (v + gamma c) >= 1  <=>  v <= tau - gamma c."""
    return drafts.expected_tau(alpha, gamma) - gamma * c


def write_kv(buf, length, new):
    """Store new (B, H, Q, D) after `length` positions of a preallocated buffer; double it when full."""
    Q = new.shape[2]
    if buf is None or buf.shape[2] < length + Q:
        grown = new.new_empty(new.shape[0], new.shape[1], max(64, 2 * (length + Q)), new.shape[3])
        if buf is not None and length:
            grown[:, :, :length] = buf[:, :, :length]
        buf = grown
    buf[:, :, length:length + Q] = new
    return buf, buf[:, :, :length + Q]


def predicted_step_ms(stages_ms, matrix_mb, bandwidth_gbs):
    """Every matrix at full bandwidth (MB / (GB/s) = ms), every other stage as measured."""
    matrices = sum(matrix_mb.values()) / bandwidth_gbs
    rest = sum(ms for stage, ms in stages_ms.items() if stage not in matrix_mb)
    return matrices + rest
