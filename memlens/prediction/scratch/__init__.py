"""Kernel scratch that fake tensors never see: reductions' staging buffers, index_put's sorted temporaries, the
cuBLAS/cuDNN workspaces.

Modules: `blocks`, `flash`, `index_put`, `modelled`, `reduce`, `workspaces`."""
