"""RMSNorm with the same rounding as transformers.

In fp32 the fused `F.rms_norm` is used (one kernel; same maths). In bf16/fp16 transformers
normalises in fp32, rounds to the model dtype and only then multiplies by the weight; we
keep that order so reduced-precision logits stay as close to transformers' as possible.
"""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
