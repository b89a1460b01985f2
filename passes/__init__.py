"""Graph-to-graph passes: autodiff, then the optimisation pipeline (`pipeline.py`)."""
