"""Task suites: Reasoning Gym families and multi-hop QA behind one `Task` protocol (see base.py)."""
