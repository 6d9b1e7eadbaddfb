"""The commands people run, ``pcitopo`` and ``xmlfix``: arguments, text and exit codes around the
library. The servers KubeVirt calls live in :mod:`pcitopo.serve`."""
