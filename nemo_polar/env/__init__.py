"""The NeMo Gym environment that runs a black-box harness session through the proxy."""
