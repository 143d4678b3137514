"""What users run over :class:`~nemo_polar.env.polar_env.PolarEnv`: ``polar rollout`` (Hydra), ``polar generate``
(SFT data by rejection sampling), the patterns matrix and the demo's runs."""
