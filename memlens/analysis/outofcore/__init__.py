"""Analyses of traces larger than memory, on Dask (`engine`), and the choice between engines (`choose`).

Nothing here is imported by ``import memlens``; dask loads only when an out-of-core analysis runs.
"""
