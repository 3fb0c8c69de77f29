"""The revision loop: states, candidates, selection, test-time adaptation."""
