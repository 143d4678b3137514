"""``make demo``: four real coding CLIs on bundled SWE-style tasks through the proxy on a real vLLM engine, graded,
reconstructed, audited, with a summary table and an HTML report. See :mod:`nemo_polar.demo`."""

import sys

from nemo_polar.demo import main

if __name__ == "__main__":
    sys.exit(main())
