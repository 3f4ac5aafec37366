"""The synthetic traces of the tests are the project's own generator (`pipeline.synthetic`)."""
from pipeline.synthetic import *  # noqa: F401,F403
from pipeline.synthetic import DEVICE_PROPS, GPU_CATS_BY_LAYOUT, TRICKY_ARGS, TRICKY_NAME  # noqa: F401
