"""What runs episodes, top to bottom: the NeMo Gym integration (``gym``); the front-ends (``frontends``: rollout,
generate, patterns, the demo's runs); the Python API, :class:`~nemo_polar.env.polar_env.PolarEnv` over its specs
(``polar_env``, ``specs``); the gateway that stages many episodes (``gateway``); the runtime of one episode
(``runtime``); the harness adapters and the scripted policy's actions (``harness``)."""
