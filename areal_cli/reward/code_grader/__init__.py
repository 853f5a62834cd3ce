"""Code grader: extract the program from a completion, run it against a problem's tests in the sandbox.

Protocol (AReaL ``evaluation/code_eval.py`` + ``code_verifier/testing_util.py``, which are LiveCodeBench's
``lcb_runner/evaluation/testing_util.py``):

- extraction: the LAST fenced block matching AReaL's pattern ``(?i)```(?:python|py|cpp|CPP)?\\s*\\n?(.*?)\\n?```
  `` whose stripped text has at least 20 characters (:func:`extract_code`); only the text after the last
  ``</think>`` is searched when there is one (code inside the reasoning is not the answer).
- tests: stdin/stdout mode when ``fn_name`` is None, else call-based (LeetCode style: the method of
  ``Solution()`` when the source says ``class Solution``, else the module-level function); each call-based
  input is one JSON value per line (the positional arguments), each output one JSON value.
- each test is run with a per-test wall-clock timeout (6 s, ``SINGLE_CASE_EXEC_TIMEOUT``), a memory cap
  (2 GiB address space) and a total cap per sample (60 s); tests run in order and grading stops at the
  first failure; a sample passes only if every test ran and passed.
- comparison without a declared tolerance: exactly LiveCodeBench (``lcb_runner/evaluation/testing_util.py``,
  ``grade_stdio`` and ``grade_call_based``). Stdin mode compares the outputs line by line after ``strip()``
  (same number of lines), each line equal as text or, failing that, as a list of ``Decimal`` numbers (numeric
  equality: ``1.0`` == ``1`` == ``1.00``; LCB uses ``Decimal`` rather than ``np.isclose`` so that
  ``50000000000000000`` != ``50000000000000001``). ``float_tol`` adds a judge-style tolerance
  (|a - b| <= tol * max(1, |b|) for tokens where either side is not an integer); off by default, for parity.
  Call-based mode compares the returned value, JSON-encoded in the sandbox and decoded here (tuples become
  lists, as LCB converts), with the JSON-decoded expected output by ``==``. The value crosses the sandbox
  boundary as JSON text, so an object with a rigged ``__eq__`` cannot fake a pass.
- comparison with a tolerance declared in the statement ("absolute or relative error does not exceed
  10^{-6}", :func:`parse_tolerance`; carried in the tests as ``TestSuite.tolerance``): what LCB accepts is
  still accepted; beyond that, numbers are compared as testlib's checkers do (:func:`numbers_close`:
  ``doubleCompare`` of ``testlib.h`` for "absolute or relative", ``acmp.cpp`` for "absolute"). Stdin mode:
  whitespace-separated tokens of the whole output (as testlib reads them; line breaks do not matter), the
  same number of them, numeric tokens (integers included, as testlib reads every number as a double) within
  the tolerance, other tokens equal as text. Call-based mode: the returned value element by element through
  lists and dicts, numbers within the tolerance, ``bool`` never a number (``True`` is not ``1.0000001``).
  LiveCodeBench itself ignores declared tolerances (exact ``Decimal`` equality, ``==``), so on problems
  that declare one our verdicts can only be more lenient than LCB's, never stricter.

Exit policy (one rule for both modes): a run passes only if the program ended normally and its output is
right. Stdin mode: the program ran to its end, or raised ``SystemExit`` with status 0 (``sys.exit()``,
``sys.exit(0)``, ``exit()``), or ended with exit status 0 without the harness's report (``os._exit(0)``: judged on
its output, as a real judge would); ``sys.exit(1)`` (any non-zero status, or a message) after a right
output is a ``runtime_error``, as on Codeforces/AtCoder. This differs from LiveCodeBench, whose stdin
runner (``call_method``) swallows ``SystemExit`` of any status and grades the output. Call-based mode: the
program's output is its return value, so the function must return (and the process end with status 0);
``sys.exit``/``os._exit`` of any status at import or during the call is a ``runtime_error``. Here LCB
agrees: its call-based runner catches only ``Exception``, so ``SystemExit`` ends the worker process and
``check_correctness`` counts every test as failed.

Where this differs from LiveCodeBench otherwise, and why:

- each test is a fresh process running the program as ``__main__`` with the test input on fd 0 (LCB wraps
  the program in a function and patches ``sys.stdin`` in one process): the program sees a real stdin
  (``sys.stdin.buffer``, ``open(0)``, ``os.read(0, ...)`` all work) and no state leaks between tests.
  An uncaught exception is a runtime error.
- dict keys: the JSON round trip turns int keys into strings (LCB would compare the int-keyed dict to the
  string-keyed expected value and fail); nested tuples become lists (LCB converts only the top level).
- the problem's own time and memory limits (``TestSuite.time_limit_s``/``memory_bytes``) are recorded but
  used only with ``use_problem_limits=True``: AReaL's evaluation applies 6 s per test to every problem.

Private tests of LiveCodeBench releases after v1 are ``base64(zlib(pickle(json_string)))``
(``lcb_runner/benchmarks/code_generation.py``); :func:`decode_lcb_tests` decodes them with an unpickler
that refuses every class, so a crafted blob cannot run code in the grader.

Modules (arrows point down; ``__init__`` exports the public names below):

- :mod:`~areal_cli.reward.code_grader.grading`: :func:`extract_code`, :func:`judge_run`, :func:`grade_code`
  (the RewardPool function), :func:`program_exit_status`;
- :mod:`~areal_cli.reward.code_grader.compare`: :func:`compare_stdout`, :func:`compare_return`;
- :mod:`~areal_cli.reward.code_grader.suite`: :class:`TestSuite`, :func:`decode_lcb_tests`;
- :mod:`~areal_cli.reward.code_grader.tolerance`: :class:`Tolerance`, :func:`parse_tolerance`,
  :func:`numbers_close`, :func:`values_close`.
"""

from areal_cli.reward.code_grader.compare import compare_return, compare_stdout
from areal_cli.reward.code_grader.grading import extract_code, grade_code, judge_run, program_exit_status
from areal_cli.reward.code_grader.suite import TestSuite, decode_lcb_tests
from areal_cli.reward.code_grader.tolerance import Tolerance, numbers_close, parse_tolerance, values_close

__all__ = [
    "TestSuite",
    "Tolerance",
    "compare_return",
    "compare_stdout",
    "decode_lcb_tests",
    "extract_code",
    "grade_code",
    "judge_run",
    "numbers_close",
    "parse_tolerance",
    "program_exit_status",
    "values_close",
]
