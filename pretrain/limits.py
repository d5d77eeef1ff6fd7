"""Ranges of user-given numbers that every command and config shares (a light module: the
command line reads it before torch is imported).

Seeds run from 0 to 2**32 - 1: what every generator here takes (torch's fails past 2**63
with a traceback, numpy's legacy one past 2**32), named in one line when a seed is outside.
"""

MAX_SEED = 2**32 - 1
# Threads a command or a hardware profile may ask for: torch and ONNX Runtime would try to
# start that many; no CPU this tool runs on has more cores.
MAX_THREADS = 1024
