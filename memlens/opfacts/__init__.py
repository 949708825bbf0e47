"""Per-op cost facts (flops, bytes read and written, dtype, shapes) from an op's name and the shapes of its
arguments: shared by the recorder (`memlens.record`) and the importers (`memlens.io`), so both derive the
same facts. Imports nothing of memlens above `memlens.errors`; torch is imported on first use."""
