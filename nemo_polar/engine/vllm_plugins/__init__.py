"""Code the engine loads: this folder goes on the engine's ``PYTHONPATH`` (see :mod:`nemo_polar.engine.launcher`).

Modules here run in the engine's virtualenv, where vLLM and torch are; nothing in the proxy's environment imports
them.
"""
