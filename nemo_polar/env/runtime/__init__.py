"""The rollout runtime: one episode of one harness on one instance — its attempt directory (``attempt``), the harness
session in a sandbox through the proxy (``session``), whether it is trained on (``verdict``) and the stages that run
it (``episode``: prepare, run_harness, grade, conclude). The gateway (``nemo_polar.env.gateway``) schedules these
stages for many episodes at once."""
