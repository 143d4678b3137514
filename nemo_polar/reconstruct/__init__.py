"""Trajectory reconstruction from the proxy's call records (per-request and prefix-merging builders)."""
