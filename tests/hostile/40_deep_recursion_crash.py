# harm: crash the interpreter with unbounded C recursion (segfault) hoping to take the grader down.
# check: runtime error (killed by a signal or RecursionError/MemoryError); grader alive.
import sys

sys.setrecursionlimit(10 ** 9)


def f(n):
    return f(n + 1) + 1


print(f(0))
