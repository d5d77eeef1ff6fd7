"""Search to a latency budget (issue 17): the latency model first (latency.py, structures.py)."""
