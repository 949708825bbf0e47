"""The cost model's rules, one module per op class (`memlens.devicetime.costmodel` dispatches to them).

- `names`: which op is in which class (and which launch nothing, or several kernels).
- `gemm`: GEMMs and convolutions (tile waves, split-K, alignment, channel padding, layout transforms).
- `attention`: fused (flash) attention, full and causal.
- `rowwise`: normalizations, softmax by row length, reductions.
- `memory`: elementwise (contiguous and broadcast), gathers, pooling, multi-tensor apply, host copies.

Every function returns device ns on a `memlens.GPU`; each names its source in its docstring.
"""
