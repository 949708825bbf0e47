"""Which fused attention calls mask causally (memlens.opfacts.attention), read from a call's arguments as a
recorder logs them: positional, by schema keyword, and the efficient kernels' mask types."""
import torch

from memlens.opfacts.attention import CAUSAL_ARG, causal_call, causal_value

T = ((2, 8, 16, 64), torch.bfloat16)          # a tensor as a signature holds it


def test_flash_attention_flag_positional_and_by_keyword():
    op = torch.ops.aten._scaled_dot_product_flash_attention.default
    assert causal_call(op, (T, T, T, 0.0, True)) is True
    assert causal_call(op, (T, T, T, 0.0, False)) is False
    assert causal_call(op, (T, T, T), {"is_causal": True}) is True
    assert causal_call(op, (T, T, T)) is False                  # default: not causal
    assert causal_call("aten::_scaled_dot_product_flash_attention", (T, T, T, 0.0, True)) is True


def test_efficient_kernels_mask_types():
    op = torch.ops.aten._efficient_attention_forward.default
    pos = CAUSAL_ARG["aten::_efficient_attention_forward"]
    args = [T, T, T, None, None, None, None, None, 0.0]
    for mask_type, causal in ((0, False), (1, True), (2, True)):
        assert causal_call(op, tuple(args[:pos]) + (mask_type,)) is causal
    assert [causal_value(v) for v in (True, False, 1, 2, 0, 3, "True", "false", "2")] == \
        [True, False, True, True, False, False, True, False, True]


def test_other_ops_are_never_causal():
    assert causal_call(torch.ops.aten.mm.default, (T, T)) is False
    assert causal_call("aten::add", (T, T, True)) is False
