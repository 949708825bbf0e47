"""memlens.predict on the models people write: `copy.deepcopy` of modules, nn.TransformerEncoder/Decoder,
`torch.utils.checkpoint`, HuggingFace `transformers` models built from a config, torchvision models.

The reference for the peaks is a real run of the same step on the CPU, recorded by torch's own profiler
(``profile_memory=True``: every allocation and free of c10's CPU allocator, in order). The prediction is
made without the GPU-only extras (cuBLAS workspaces, CUDA kernels' own temporaries) so that both count the
same tensors; its sizes are rounded up to the caching allocator's 512 bytes, the profiler's are not. Parameter,
gradient and optimizer-state bytes are worked out by hand from the model's shapes.
What a failed or checkpoint-saving script gets is checked in tests/integration/test_predict_script_outcomes.py.
"""
from __future__ import annotations

import pytest

from _predict_cases import built_shim, run_child  # noqa: F401  (built_shim: the module fixture)

CPU_REFERENCE = """
import copy, warnings
import torch.nn as nn
from torch.profiler import profile, ProfilerActivity

def cpu_peak(step):
    # the real CPU run's peak of live bytes in c10's CPU allocator, from the profiler's memory events
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step("cpu")
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for _, nbytes in sorted(events, key=lambda e: e[0]):
        live += nbytes
        peak = max(peak, live)
    return peak

def predicted(step):
    with memlens.predict(gpu="H100", cublas_workspaces=False, kernel_scratch=False) as p:
        step("cuda")
    return p

def figures(step):
    p = predicted(step)
    cuda = p.trace.blocks[p.trace.blocks.device == "cuda:0"]
    cat = cuda.groupby("category").requested_size.sum()
    return {"predicted": p.peak_allocated, "reference": cpu_peak(step),
            "param_bytes": int(cat.get("parameter", 0)), "opt_state": int(cat.get("optimizer_state", 0))}

def adamw_step(make_model, make_batch, loss_of):
    # one training step: fp32 model, AdamW (per-parameter path, as on the CPU), backward, step
    def step(device):
        torch.manual_seed(0)
        model = make_model().to(device)
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        loss_of(model, make_batch(device)).backward()
        opt.step()
    return step
"""

# |predicted - reference| / reference, 0.1 %: the prediction rounds each block up to 512 bytes and leaves out
# AdamW's step counters (they live on the host); measured: < 0.001 % on the torch.nn models here, +0.02 %
# (GPT-2) and +0.04 % (Llama) on the HuggingFace ones
TOLERANCE = 0.001


def check_against_cpu(r: dict, n_params: int, name: str) -> None:
    assert r["param_bytes"] == 4 * n_params, name
    # AdamW: exp_avg and exp_avg_sq per parameter, fp32
    assert r["opt_state"] == 2 * 4 * n_params, name
    # after the step params, grads and both moments are alive at once
    assert r["predicted"] >= 4 * 4 * n_params, name
    assert abs(r["predicted"] - r["reference"]) <= TOLERANCE * r["reference"], (name, r)


def linear(i: int, o: int) -> int:
    return i * o + o


def encoder_layer_params(d: int, ff: int) -> int:
    # self-attention in_proj (3d x d + 3d) and out_proj, the feed-forward pair, two LayerNorms
    return linear(d, 3 * d) + linear(d, d) + linear(d, ff) + linear(ff, d) + 2 * 2 * d


def test_user_deepcopy_of_a_module_inside_the_prediction():
    r = run_child(CPU_REFERENCE + """
twins = {}
def step(device):
    torch.manual_seed(0)
    layer = nn.Linear(1024, 1024, device=device)
    twin = copy.deepcopy(layer)      # the user's own copy: new parameters, the same values
    if device == "cuda":
        twins.update(same_mode=twin.weight.fake_mode is layer.weight.fake_mode, device=str(twin.weight.device),
                     shared=twin.weight is layer.weight, is_param=isinstance(twin.weight, nn.Parameter))
    x = torch.randn(256, 1024, device=device)
    (layer(x) + twin(x)).pow(2).mean().backward()
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    p = predicted(step)
    warnings.warn("the user's own warning")
cuda = p.trace.blocks[p.trace.blocks.device == "cuda:0"]
result = {"twins": twins, "param_bytes": int(cuda[cuda.category == "parameter"].requested_size.sum()),
          "predicted": p.peak_allocated, "reference": cpu_peak(step),
          "warnings": [str(w.message)[:60] for w in seen]}
""")
    assert r["twins"] == {"same_mode": True, "device": "cuda:0", "shared": False, "is_param": True}
    n = linear(1024, 1024)
    assert r["param_bytes"] == 2 * 4 * n          # the copy owns its own parameters
    # the backward's peak: both layers' params and grads, the input and both outputs
    assert r["predicted"] >= 4 * 4 * n
    assert abs(r["predicted"] - r["reference"]) <= TOLERANCE * r["reference"], r
    # torch's FakeTensor data_ptr warning (deepcopy reads the pointer) is not shown; the user's own warnings are
    assert r["warnings"] == ["the user's own warning"]


def test_the_data_ptr_warning_exists_outside_a_prediction():
    """The control for the test above: the same deepcopy under a plain FakeTensorMode warns (once a process),
    so the silence inside a prediction is the prediction's filter, and the filter is gone after the block."""
    r = run_child("""
import copy, warnings
from torch._subclasses.fake_tensor import FakeTensorMode
with memlens.predict(gpu="H100"):
    inside = [str(f[1].pattern) for f in warnings.filters if f[1] is not None]
after = [str(f[1].pattern) for f in warnings.filters if f[1] is not None]
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    with FakeTensorMode():
        copy.deepcopy(torch.nn.Linear(4, 4))
result = {"seen": sum("data pointer of FakeTensor" in str(w.message) for w in seen),
          "filter_inside": any("data pointer of FakeTensor" in f for f in inside),
          "filter_after": any("data pointer of FakeTensor" in f for f in after)}
""")
    assert r == {"seen": 1, "filter_inside": True, "filter_after": False}


def test_transformer_encoder_and_decoder_match_a_real_cpu_run():
    r = run_child(CPU_REFERENCE + """
enc = adamw_step(lambda: nn.TransformerEncoder(
                     nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True), 2),
                 lambda d: torch.randn(8, 32, 256, device=d), lambda m, x: m(x).pow(2).mean())
dec = adamw_step(lambda: nn.TransformerDecoder(
                     nn.TransformerDecoderLayer(256, 4, 1024, dropout=0.0, batch_first=True), 2),
                 lambda d: (torch.randn(8, 32, 256, device=d), torch.randn(8, 16, 256, device=d)),
                 lambda m, x: m(*x).pow(2).mean())
result = {"encoder": figures(enc), "decoder": figures(dec)}
""")
    d, ff = 256, 1024
    # nn.TransformerEncoder deep-copies its layer num_layers times (the failure this test guards against)
    check_against_cpu(r["encoder"], 2 * encoder_layer_params(d, ff), "encoder")
    # a decoder layer adds cross-attention (in_proj + out_proj) and a third LayerNorm
    decoder_layer = encoder_layer_params(d, ff) + linear(d, 3 * d) + linear(d, d) + 2 * d
    check_against_cpu(r["decoder"], 2 * decoder_layer, "decoder")


def test_activation_checkpointing_reentrant_and_not():
    r = run_child(CPU_REFERENCE + """
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
    def forward(self, x):
        return x + self.f(x)

class Net(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.reentrant = reentrant
    def forward(self, x):
        for b in self.blocks:
            x = b(x) if self.reentrant is None else checkpoint(b, x, use_reentrant=self.reentrant)
        return x

result = {str(mode): figures(adamw_step(lambda mode=mode: Net(mode),
                                        lambda d: torch.randn(16, 128, 512, device=d, requires_grad=True),
                                        lambda m, x: m(x).pow(2).mean()))
          for mode in (None, False, True)}
""")
    n = 4 * (linear(512, 2048) + linear(2048, 512))
    for mode in ("None", "False", "True"):
        check_against_cpu(r[mode], n, f"use_reentrant={mode}")
    # without checkpointing each block keeps its first Linear's output and GELU's output (16*128 tokens of 2048
    # floats each) until backward; with it, only the block's input. The checkpointed peaks come at the
    # optimizer step instead (params + grads + two moments: 16 bytes a parameter), so they are at least that
    # and the plain run's is higher by more than one block's saved activations
    saved_per_block = 2 * 16 * 128 * 2048 * 4
    for mode in ("False", "True"):
        assert r[mode]["predicted"] >= 16 * n, mode
        assert r["None"]["predicted"] - r[mode]["predicted"] >= saved_per_block, mode


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


HF_STEP = """
def hf_step(make_model):
    def step(device):
        torch.manual_seed(0)
        model = make_model().to(device)
        opt = torch.optim.AdamW(model.parameters(), foreach=False)
        ids = torch.randint(0, 1000, (4, 64), device=device)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    return step
"""


@pytest.mark.skipif(not _has("transformers"), reason="HuggingFace transformers is not installed "
                                                     "(pip install 'memlens[models]')")
def test_transformers_models_from_a_config():
    """GPT-2 and Llama built from a config (random weights, nothing downloaded), one AdamW step.

    Dropout is off and Llama has as many key/value heads as query heads: with dropout, or with grouped-query
    attention, the CPU run takes a different attention kernel (CPU flash attention handles both; CUDA's
    fp32 kernels do not), so the CPU run would not be a reference for the GPU's path."""
    r = run_child(CPU_REFERENCE + HF_STEP + """
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
gpt2 = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128, bos_token_id=0,
                  eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
llama = LlamaConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                    num_key_value_heads=4, vocab_size=1000)
result = {"gpt2": figures(hf_step(lambda: GPT2LMHeadModel(gpt2))),
          "llama": figures(hf_step(lambda: LlamaForCausalLM(llama)))}
""")
    V, d, L = 1000, 128, 2
    # GPT-2: token and position embeddings, per layer two LayerNorms, c_attn (d -> 3d), c_proj, the MLP's
    # c_fc (d -> 4d) and c_proj (4d -> d), all with biases; final LayerNorm; the LM head is tied to wte
    gpt2 = V * d + 128 * d + L * (2 * 2 * d + linear(d, 3 * d) + linear(d, d) + linear(d, 4 * d) + linear(4 * d, d)) \
        + 2 * d
    check_against_cpu(r["gpt2"], gpt2, "gpt2")
    # Llama: embeddings; per layer q, k, v, o (d x d, no bias), gate, up (d -> 256), down, two RMSNorm
    # weights; final norm; an untied LM head
    ff = 256
    llama = V * d + L * (4 * d * d + 3 * d * ff + 2 * d) + d + V * d
    check_against_cpu(r["llama"], llama, "llama")


@pytest.mark.skipif(not _has("torchvision"), reason="torchvision is not installed: the package index used here "
                    "has only CUDA builds of torchvision for torch 2.13 (0.28.0 bundles libcudart), which memlens's "
                    "environment does not install; install a CPU build of torchvision to run this")
def test_torchvision_resnet18():
    """torchvision's ResNet-18 (10 classes), one AdamW step at batch 4 on 64x64 images. Not run where this
    was written (no CPU build of torchvision there): the checks are the hand arithmetic, and the CPU run only
    as a loose bound, since CPU convolution and batch-norm kernels keep other tensors than cuDNN's (a
    hand-written ResNet-style net measured 5.6 % apart)."""
    r = run_child(CPU_REFERENCE + """
import torchvision
step = adamw_step(lambda: torchvision.models.resnet18(num_classes=10), lambda d: torch.randn(4, 3, 64, 64, device=d),
                  lambda m, x: m(x).pow(2).mean())
result = figures(step)
""")
    def conv(i, o, k):
        return i * o * k * k

    def bn(c):
        return 2 * c

    def block(i, o, downsample):
        return conv(i, o, 3) + conv(o, o, 3) + 2 * bn(o) + ((conv(i, o, 1) + bn(o)) if downsample else 0)
    n = conv(3, 64, 7) + bn(64)
    n += 2 * block(64, 64, False)
    for i, o in ((64, 128), (128, 256), (256, 512)):
        n += block(i, o, True) + block(o, o, False)
    n += linear(512, 10)
    assert n == 11_181_642     # torchvision's documented 11,689,512 with a 1000-class head, less 995 * 513
    assert r["param_bytes"] == 4 * n and r["opt_state"] == 2 * 4 * n
    assert r["predicted"] >= 4 * 4 * n
    assert abs(r["predicted"] - r["reference"]) <= 0.15 * r["reference"], r


def test_silu_and_mish_backward_run_as_one_fused_kernel():
    """SwiGLU's silu: CUDA (and CPU) run ``silu_backward`` as one kernel that allocates the gradient only; on
    a CPU-only build the fake `cuda` op used to fall back to its decomposition (sigmoid, ones, sub, mul,
    add, mul, mul: up to six input-sized temporaries). The gradient arriving from ``sum`` is an expanded
    (stride 0) tensor, which must not make the prediction decompose the op either."""
    r = run_child(CPU_REFERENCE + """
import torch.nn.functional as F
out = {}
for name, act in (("silu", F.silu), ("mish", F.mish)):
    def step(device, act=act):
        x = torch.randn(64, 256, device=device, requires_grad=True)
        act(x).sum().backward()
    p = predicted(step)
    out[name] = {"ops": p.trace.ops.name.tolist(), "predicted": p.peak_allocated, "reference": cpu_peak(step)}
result = out
""")
    x = 64 * 256 * 4
    for name in ("silu", "mish"):
        f = r[name]
        assert f["ops"] == ["aten::randn", f"aten::{name}", "aten::sum", "aten::ones_like", "aten::expand",
                            f"aten::{name}_backward", "aten::detach"], name
        # at most two input-sized tensors at once (x with its output, then x with its gradient) and two
        # 4-byte scalars (the sum and backward's seed), each rounded up to 512 bytes
        assert f["predicted"] == 2 * x + 2 * 512, name
        # the CPU run: the same two tensors, the scalars unrounded (its mish keeps no extra either)
        assert abs(f["predicted"] - f["reference"]) <= 1024, (name, f)


def test_transformer_encoder_inference_with_a_padding_mask():
    """nn.TransformerEncoder in eval mode under no_grad with a padding mask takes torch's fast path, which
    packs the batch into nested tensors: fake tensors cannot, so a prediction runs the regular path (the
    padded batch: an upper bound). Reference: the CPU run of that same regular path."""
    r = run_child(CPU_REFERENCE + """
def step(device):
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), 2,
                                enable_nested_tensor=True).to(device).eval()
    x = torch.randn(8, 32, 256, device=device)
    pad = torch.zeros(8, 32, dtype=torch.bool, device=device)
    pad[:, 24:] = True
    with torch.no_grad():
        enc(x, src_key_padding_mask=pad)
p = predicted(step)
torch.backends.mha.set_fastpath_enabled(False)
reference = cpu_peak(step)
result = {"predicted": p.peak_allocated, "reference": reference,
          "param_bytes": int(p.trace.blocks[(p.trace.blocks.device == "cuda:0")
                                            & (p.trace.blocks.category == "parameter")].requested_size.sum())}
""")
    assert r["param_bytes"] == 4 * 2 * encoder_layer_params(256, 1024)
    assert r["predicted"] >= r["param_bytes"] + 8 * 32 * 256 * 4
    # with a mask the CPU's attention is the math path: scores and their softmax, 8 x 4 heads x 32 x 32 fp32,
    # are materialised, which CUDA's memory-efficient kernel (the prediction's choice) never does; the rest
    # agrees within 0.2 % (measured: 11,776 bytes of 9,477,120 left after those two tensors)
    scores = 8 * 4 * 32 * 32 * 4
    assert abs(r["reference"] - r["predicted"] - 2 * scores) <= 0.002 * r["reference"], r
