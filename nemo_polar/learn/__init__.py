"""A closed GRPO loop on the project's own traces (``polar learn``): rollouts through the proxy, prefix-merged
traces, per-session advantages, a NeMo-RL-style clipped policy-gradient update, and the new weights loaded into the
running vLLM engine between a proxy ``pause`` and ``resume`` with the next policy version. A check of the data path
end to end, not a replacement for NeMo-RL."""
