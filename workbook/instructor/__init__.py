"""What an instructor runs (beside the families): generating lab stubs from the solutions
(``assign``), grading a class (``classroom``), the Gradescope autograder (``autograder``), and
CI's check that the stubs grade to zero (``selftest``).
"""
