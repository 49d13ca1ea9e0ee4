"""Experiments built on the library: the demo's stages (`demo`), the objective replication
(`replication`, the paper's Table 5 at the demo's scale) and the Electric ranking study (`ranking`).

They import the library and nothing in the library imports them (`tests/test_layers.py`); the
binaries that run them are `tools/demo.py`, `tools/replicate.py` and `tools/electric_ranking.py`.
"""
