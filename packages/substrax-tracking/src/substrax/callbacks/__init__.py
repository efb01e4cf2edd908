"""substrax.callbacks: the training-callback protocol, early stopping and other metric-driven callbacks.

A callback is structural (:class:`TrainingCallback` is a Protocol); a trainer drives a
:class:`CallbackList` through its hooks and reads ``should_stop`` itself.
"""

from substrax.support import lazy_exports


# The public names are listed in __init__.pyi beside this file; eager=True loads them now.
lazy_exports(__name__, eager=True)
