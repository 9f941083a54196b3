"""The digits task that Flower and the swarm both run in the benchmark (``bench/flower_compare.py``)."""
