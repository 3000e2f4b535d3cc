"""`mechlab bench ...`: speed and memory measurements, run side by side and reported as ratios."""
