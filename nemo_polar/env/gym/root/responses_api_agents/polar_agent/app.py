"""Gym entrypoint of the Polar agent: `gym env start` runs this file in the server's environment, with
NEMO_GYM_CONFIG_DICT / NEMO_GYM_CONFIG_PATH naming its config (see nemo_polar/env/gym/agent.py)."""

from nemo_polar.env.gym.agent import PolarAgent

if __name__ == "__main__":
    PolarAgent.run_webserver()
