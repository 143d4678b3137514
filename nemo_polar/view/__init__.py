"""``polar view``: a self-contained static HTML report of sessions, calls, chains and their tokens
(:mod:`nemo_polar.view.report`)."""
