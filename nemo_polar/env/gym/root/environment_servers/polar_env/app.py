"""Gym entrypoint of the Polar environment server: `gym env start` runs this file in the server's environment, with
NEMO_GYM_CONFIG_DICT / NEMO_GYM_CONFIG_PATH naming its config (see nemo_polar/env/gym/environment_server.py)."""

from nemo_polar.env.gym.environment_server import PolarEnvironmentServer

if __name__ == "__main__":
    PolarEnvironmentServer.run_webserver()
