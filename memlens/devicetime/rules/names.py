"""Which op is in which class of the cost model, from its ATen name alone."""
from __future__ import annotations

# the causal flag's position per fused attention op lives with the op facts (the recorder reads it too)
from memlens.opfacts.attention import CAUSAL_ARG, causal_value  # noqa: F401  (CAUSAL_ARG: re-exported)

GEMM = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::_scaled_mm",
                  "aten::_int_mm", "aten::mv", "aten::addmv", "aten::dot", "aten::vdot", "aten::matmul",
                  "aten::_addmm_activation"})
CONV = frozenset({"aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
                  "aten::convolution_overrideable", "aten::mkldnn_convolution", "aten::miopen_convolution",
                  "aten::cudnn_convolution_transpose", "aten::convolution_backward",
                  "aten::miopen_depthwise_convolution", "aten::_conv_depthwise2d"})
ATTENTION_BHSD = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                  "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_fused_attention_overrideable")
ATTENTION_BSHD = ("aten::_flash_attention_forward", "aten::_efficient_attention_forward",
                  "aten::_flash_attention_backward", "aten::_efficient_attention_backward")
SOFTMAX = frozenset({"aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data",
                     "aten::_log_softmax_backward_data", "aten::softmax", "aten::log_softmax"})
BATCH_NORM = frozenset({"aten::native_batch_norm", "aten::_batch_norm_with_update", "aten::_native_batch_norm_legit",
                        "aten::cudnn_batch_norm", "aten::miopen_batch_norm", "aten::native_batch_norm_backward",
                        "aten::batch_norm_backward", "aten::cudnn_batch_norm_backward",
                        "aten::miopen_batch_norm_backward"})
NORM = frozenset({"aten::native_layer_norm", "aten::native_group_norm", "aten::_fused_rms_norm", "aten::rms_norm",
                  "aten::native_layer_norm_backward", "aten::native_group_norm_backward",
                  "aten::_fused_rms_norm_backward", "aten::_native_batch_norm_legit_no_training"}) | SOFTMAX | BATCH_NORM
REDUCTION = frozenset({"aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min",
                       "aten::all", "aten::any", "aten::argmax", "aten::argmin", "aten::prod", "aten::var",
                       "aten::std", "aten::var_mean", "aten::std_mean", "aten::norm", "aten::linalg_vector_norm",
                       "aten::logsumexp", "aten::cumsum", "aten::cumprod", "aten::nll_loss_forward",
                       "aten::nll_loss2d_forward", "aten::mse_loss", "aten::count_nonzero", "aten::_cdist_forward",
                       "aten::topk", "aten::sort", "aten::median", "aten::nansum", "aten::aminmax"})
GATHER = frozenset({"aten::embedding", "aten::index_select", "aten::gather", "aten::index", "aten::take",
                    "aten::embedding_dense_backward", "aten::index_put_", "aten::_index_put_impl_",
                    "aten::scatter", "aten::scatter_", "aten::scatter_add", "aten::scatter_add_",
                    "aten::index_add_", "aten::index_add", "aten::embedding_bag", "aten::_embedding_bag"})
POOLING = frozenset({"aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices", "aten::avg_pool2d",
                     "aten::avg_pool3d", "aten::_adaptive_avg_pool2d", "aten::adaptive_max_pool2d",
                     "aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward",
                     "aten::avg_pool2d_backward", "aten::avg_pool3d_backward",
                     "aten::_adaptive_avg_pool2d_backward", "aten::adaptive_max_pool2d_backward"})
TRANSFER = frozenset({"aten::_local_scalar_dense"})
# Ops that return a view or metadata and launch no kernel, even when a profile or a recorder counts bytes
# for them: `_unsafe_view` and `_reshape_alias` alias their input (PyTorch's native_functions.yaml), and
# the composites below appear as leaf ops in a profile only when they had nothing to do (dropout in eval
# mode returns its input; contiguous/reshape/to of a tensor that already is so return it).
ZERO_COST = frozenset({"aten::_unsafe_view", "aten::_reshape_alias", "aten::alias", "aten::lift_fresh",
                       "aten::result_type", "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
                       "aten::detach_", "aten::resolve_conj", "aten::resolve_neg", "aten::contiguous",
                       "aten::reshape", "aten::to", "aten::type_as", "aten::expand_as", "aten::flatten",
                       "aten::view_as", "aten::reshape_as", "aten::unflatten", "aten::is_nonzero",
                       "aten::item", "aten::size", "aten::stride", "aten::numel", "aten::dim"})

def logged_list(value):
    """A profile's logged argument list as a list: `value` itself, or its JSON text decoded (None when the
    text is not JSON)."""
    if not isinstance(value, str):
        return value
    import json
    try:
        return json.loads(value)
    except ValueError:
        return None


def causal_from_args(name: str, concrete_args) -> bool:
    """True when the scalar arguments of fused attention op `name` (a list of their texts, or its JSON
    string) ask for a causal mask; False otherwise or when unknown."""
    pos = CAUSAL_ARG.get(base_name(name))
    if pos is None or not concrete_args:
        return False
    concrete_args = logged_list(concrete_args)
    if not isinstance(concrete_args, (list, tuple)) or len(concrete_args) <= pos:
        return False
    return causal_value(concrete_args[pos])       # True, or mask types 1, 2


# eager CUDA ops that launch more than one kernel (PyTorch's native CUDA implementations)
MULTI_KERNEL = {
    "aten::native_layer_norm_backward": 2,      # input grad, then gamma/beta grads
    "aten::native_group_norm_backward": 3,
    "aten::native_batch_norm_backward": 2,
    "aten::batch_norm_backward": 2,
    "aten::_fused_rms_norm_backward": 2,
    "aten::embedding_dense_backward": 4,        # sort indices, segment offsets, partial sums, scatter
    "aten::_flash_attention_backward": 3,       # dO.O preprocess, main, dQ convert
    "aten::_scaled_dot_product_flash_attention_backward": 3,
    "aten::_efficient_attention_backward": 2,
    "aten::_scaled_dot_product_efficient_attention_backward": 2,
    "aten::convolution_backward": 2,            # one launch per gradient asked for (input, weight)
    "aten::nonzero": 3, "aten::_unique2": 5, "aten::unique_dim": 5, "aten::unique_consecutive": 4,
    "aten::sort": 2, "aten::topk": 2, "aten::multinomial": 3, "aten::index_put_": 3,
    "aten::_index_put_impl_": 3, "aten::max_pool2d_with_indices_backward": 2, "aten::nll_loss_forward": 1,
    "aten::cross_entropy_loss": 3, "aten::_cdist_forward": 2, "aten::median": 2,
}

CLASSES = ("none", "gemm", "attention", "normalization", "reduction", "gather", "elementwise", "foreach",
           "transfer", "communication")


def base_name(name: str) -> str:
    """``"aten::add.Tensor"`` -> ``"aten::add"`` (overloads cost the same)."""
    head, sep, tail = name.partition("::")
    return head + sep + tail.split(".", 1)[0] if sep else name.split(".", 1)[0]


def op_class(name: str, flops: int = 1, bytes_moved: int = 1) -> str:
    """The class of an op (see `memlens.devicetime.costmodel`); ``"none"`` for ops that move no byte
    and for views / metadata ops that launch nothing."""
    n = base_name(name)
    if (flops == 0 and bytes_moved == 0) or n in ZERO_COST:
        return "none"
    if n in GEMM or n in CONV:
        return "gemm" if flops > 0 else "elementwise"
    if n in ATTENTION_BHSD or n in ATTENTION_BSHD or "scaled_dot_product" in n and "backward" in n:
        return "attention"
    if n in NORM:
        return "normalization"
    if n in REDUCTION:
        return "reduction"
    if n in GATHER:
        return "gather"
    if n in TRANSFER:
        return "transfer"
    if n.startswith("aten::_foreach_") or n.startswith("aten::_fused_adam") or n.startswith("aten::_fused_sgd"):
        return "foreach"
    return "elementwise"
