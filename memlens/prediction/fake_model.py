"""How a real `nn.Module` moves onto fake `cuda` inside a prediction (`memlens.fake`), without a byte of GPU or
host memory for its weights."""
from __future__ import annotations

from memlens.prediction.predictor import active_prediction


def fake(model):
    """Move a real `nn.Module` onto fake `cuda` inside an active prediction, without allocating real memory.

    Each parameter and buffer is replaced by a fake `cuda` tensor of the same shape, dtype and strides
    (values are not copied: predictions need none). Returns the module (changed in place).
    """
    import torch
    p = active_prediction()
    if p is None:
        raise RuntimeError("memlens.fake(model) works inside `with memlens.predict(...)`")
    for module in model.modules():
        for key, param in list(module._parameters.items()):
            if param is None:
                continue
            new = torch.empty_strided(param.shape, param.stride(), dtype=param.dtype, device="cuda")
            module._parameters[key] = torch.nn.Parameter(new, requires_grad=param.requires_grad)
        for key, buf in list(module._buffers.items()):
            if buf is not None:
                module._buffers[key] = torch.empty_strided(buf.shape, buf.stride(), dtype=buf.dtype, device="cuda")
    session = p._recorder._session
    if session is not None and p.model is model:
        session._register_modules(model, session.module_prefix)
    return model
