import sys

from nemo_polar.env.harness import install

install(sys.argv[1:] or None)
