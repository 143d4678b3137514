"""Rewards for reconstructed trajectories (SWE-Bench FAIL_TO_PASS / PASS_TO_PASS in a fresh sandbox)."""
