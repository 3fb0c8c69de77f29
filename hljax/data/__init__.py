"""Building training data: teacher revisions for SFT (collect.py), through a teacher client (teacher.py)."""
