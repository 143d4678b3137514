"""nemo_polar: reinforcement learning of language agents inside their real harnesses.

Data flows proxy -> records -> reconstruct -> rewards -> env: the proxy (:mod:`nemo_polar.proxy`) sits between an
unchanged coding CLI and a vLLM engine and records exactly what the engine was given and sampled.
"""

__version__ = "0.1.0"
