"""Math answer extraction and grading: our own extraction and normalisation in front of math-verify.

Extraction (:func:`extract_answer`) follows the AReaL / Qwen2.5-Math evaluation parser
(``realhf/impl/dataset/math_parser.py::extract_answer`` in AReaL, ``evaluation/parser.py`` in Qwen2.5-Math):
the final answer is the content of the LAST ``\\boxed{...}`` or ``\\fbox{...}``, nested braces matched
(``\\{``/``\\}`` are literal), brace-less ``\\boxed 5`` too; without a box, a clearly stated final answer.

- Reasoning block (policy): only the text after the last ``</think>`` counts. A completion that opened
  ``<think>`` and never closed it (cut off while thinking) has no answer, even if it boxed one inside; and
  an answer boxed (or stated) only inside the think block, with nothing after ``</think>``, is no answer
  either: the reasoning is a draft, the final answer is what the model says after it (as the
  ``box_in_think_only`` / ``think_only`` cases of the tables). AReaL's parser reads the whole text and
  would take such a box; we do not.
- End of turn: text after an end-of-turn token (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``,
  ``<|eot_id|>``, ``</s>``, DeepSeek's end of sentence) is a hallucinated next turn and is ignored.
- A box that is never closed (truncated output) or is empty is skipped in favour of an earlier one.
- Minerva's "The final answer is $X$. I hope it is correct." written after the last box is the final
  answer (AReaL's parser reads that statement before any box; math-verify gives it the boxes' priority).
- Several boxes (policy): the answer is the last box together with the boxes directly before it that belong
  to it, joined with ``", "`` (math-verify reads the join as a set): boxes separated only by connectors
  (``,`` ``;`` "and" "or" ``\\quad`` ``$`` whitespace, an ``x =`` label), or by a few words that contain
  "and"/"or" and no sign of a revision ("papers and", ``\\text{ for part (a) and }``), with math
  delimiters ``\\(``...``\\)`` / ``$`` around the boxes ignored. This is math-verify's own rule for boxes
  (``latex2sympy2_extended.extract_boxed_content``: joined when close together or separated by and/or/,/;)
  made stricter: a model that lists several solutions boxes each one and a careful grader reads them
  together; a model that hedges (``\\boxed{3} or \\boxed{5}`` for gold 5) gives a two-element set, which
  does not equal 5, so hedging is wrong. Boxes separated by other words ("first \\boxed{3}, on reflection
  \\boxed{5}", "no no no \\boxed{2}") are revisions: only the last one counts. At most the last 10 boxes.
- No box (:func:`stated_answer`; AReaL's parser falls back to "the answer is" / "final answer is"
  statements): a clearly stated final answer is graded --

  1. an answer statement: "final answer is X" (also Minerva's "Final Answer: The final answer is $X$. I
     hope it is correct."), "Final Answer: X", "**Final Answer**" then X, "the answer is X", "Answer: X",
     a line that starts with "Answer"; the last such statement that states a value. The value is the math
     right after the anchor (a formula without delimiters is read whole: for "Answer: x = 3 + 4 = 7"
     math-verify compares the last side, 7), or the value after the statement's last "is" / "=" in prose
     ("Final Answer: The volume is 120." -> 120), or its only number or math. In a completion that is cut
     off, only statements that declare the answer final ("final answer", "Answer:") count;
  2. only in a finished completion (not cut off: no unclosed box or math delimiter, ends with ``.`` ``!``
     ``?``, closing math or bold): a bold value at the very end (``**42**``), or a concluding last
     sentence ("Therefore/Thus/So/Hence/Finally ... is X.", also right after a formula without a full
     stop) with a value as above that has a digit or math;
  3. a short completion -- one line, one sentence, 200 characters at most -- is its own statement
     ("$x = 5$", "The sum is $12$.", "28 percent"); when it does not end like a sentence, only a value
     that is all that follows its last "is"/"=" ("... which is 1,000.99€"), or a completion of at most
     three words, counts.

  The last number of a completion is never an answer by itself (AReaL's last resort; not used): a
  truncated or unfinished completion without a box or an answer statement has no answer.

Normalisation (:func:`clean_answer`, applied to gold and extracted answers before math-verify) fixes
forms math-verify 0.9.0 misreads; what it already reads correctly is left to it:

- zero-padded integers: ``025`` == 25 (math-verify; AIME golds are written this way);
- thousands separators: ``1,000`` ``10{,}080`` ``10,\\!080`` ``\\$32,348`` (math-verify), and
  ``10\\,000`` / ``10 000`` / ``10\\ 000`` / ``14{, }916`` (here, only when the whole answer is such a
  number). Groups must have 3 digits: ``1,2`` stays the list {1, 2}; a comma followed by a space is a list
  separator, not a thousands separator: ``32, 349`` != 32349 (a Math-Verify test case);
- decimal comma (:func:`decimal_comma_value`): ``1000,99`` == 1000.99 and ``0,111`` == 0.111 when the other
  answer is a decimal number (Math-Verify's ``test_number_extraction``); ``1,234`` stays a thousands form;
- percent (policy): a ``%`` sign (``\\%``, ``%``, "percent", "pct") means "hundredths". An answer with a
  percent sign equals both the number in front of it and that number / 100, in either direction:
  ``50\\%`` == 50 == 0.5 (math-verify's rule, made symmetric and exact here), unless the problem fixes the
  unit (:func:`unit_asked`): when it asks for a percent, 0.2 is not 20% ; when it asks for a decimal or
  a fraction, 20% is not 0.2. Two bare numbers are compared as they are: 50 != 0.5. AReaL's
  ``math_equal`` also accepts x/100 and 100x between bare numbers; we do not, because then 0.5 would grade
  correct for a count of 50;
- degrees: ``^\\circ``, ``^{\\circ}``, ``\\degree``, ``°`` and "degrees" are dropped (90° == 90); radians
  are not converted (``\\frac{\\pi}{2}`` != 90°);
- units: ``\\text{cm}``, ``\\mbox{ inches}^2``, ``\\mathrm{m}`` after a number are dropped (math-verify),
  and so are a leading ``\\$``, trailing bare "dollars"/"cents", currency signs (``1,000.99€``) and a
  bare unit after a number (``1,000.99m²``, ``15 cm``; Math-Verify's ``test_number_extraction``);
- ``\\dfrac``/``\\tfrac`` == ``\\frac``; ``\\left``/``\\right`` ignored;
- intervals and sets (math-verify): sets compare order-insensitively (``\\{2,1\\}`` == ``\\{1,2\\}``,
  and a bare list ``1, -2`` is a set); open and closed ends differ (``(1,2]`` != ``[1,2]``); tuples
  are ordered (``(3, \\pi/2)`` != ``(\\pi/2, 3)``); unions compare by their parts. An inequality equals
  the interval it describes, in either direction (``3 < x \\le 4`` == ``(3, 4]``, ``x < 2 \\text{ or }
  x > 5`` == ``(-\\infty, 2) \\cup (5, \\infty)``; :func:`relation_as_set`).

Equivalence (:func:`grade`, :func:`is_equivalent`):

1. multiple choice (:func:`choice_verdict`): a letter (``C``, ``(C)``, ``\\text{(C)}``) given alone, with
   its option text (``(C) 5``) or as its option text (``5``) equals the gold letter or text; the options
   are read from the problem (AReaL's ``math_equal`` compares letters; here also their texts);
2. equal :func:`normalize_answer_string` forms;
3. exact arithmetic when both answers are plain numbers (integers, decimals, ``a/b``, ``\\frac{a}{b}``):
   equal values are equal; two unequal integers/fractions are unequal; a decimal that differs is left to
   math-verify (which rounds to 6 places: ``0.3333333`` == 1/3);
4. math-verify 0.9.0 ``parse`` + ``verify`` (Hugging Face, Apache-2.0), with set/relation comparison
   allowed; then, when math-verify says equal and both sides are exact rational numbers (integers,
   fractions, powers, factorials), they are compared exactly (:func:`exact_value`): math-verify compares
   numbers by floating point rounded to 6 places, so 1/2004! equalled 1/2006! (math-verify issue #14) and
   1/2^99 equalled 1/2^98;
5. false accepts refused when the problem is given (:func:`restates_problem`): an answer that restates an
   expression of the problem (unfactored when the problem asks to factor, unevaluated, copied from the
   problem text) is wrong although it has the gold's value.

Parsed answers are memoised per process (``lru_cache``): the gold of a problem is graded against every one
of its samples.

Timeouts. math-verify's own signal timeouts are disabled (they are whole seconds and it turns a timeout
into a silent "wrong"). Instead:

- :func:`grade` (one answer per pool call) has no time limit of its own: run it in
  :class:`areal_cli.reward.pool.RewardPool`, whose hard timeout kills the worker (status "timeout").
- :func:`grade_many` (a batch per pool call) gives each answer a soft timeout with ``SIGALRM``
  (``setitimer``; the pool worker runs functions on its main thread). An answer over its limit gets
  status ``"timeout"`` (graded wrong, counted), and the batch goes on. Towers such as
  ``10^{10^{10^{10}}}`` and ``(10^{10})!`` end this way: sympy works on them in Python code, where the
  signal gets through. A computation stuck inside one C call cannot be interrupted: then the pool's hard
  timeout kills the worker and the whole batch comes back as one pool "timeout".
- :func:`grade_in_pool` is the batch driver for callers: it sends batches to the pool
  (:func:`grade_batch`) and re-grades the items of any batch that the pool killed or that ran out of its
  budget one at a time with :func:`grade` (one hard timeout each), so a hang costs one answer, never a
  batch, and never a crash.

Pool entry points: ``grade`` (``(extracted, correct)``), ``equivalent`` (bool) and ``grade_batch``
(``(list of (extracted, correct, status), fraction correct)``). :func:`grade_many` itself returns a
list of tuples, which :func:`areal_cli.reward.pool.to_reward` does not accept as a score; ``grade_batch``
wraps it with the batch's fraction correct as the last element, the pool's "details, then score"
convention. Every entry point takes the problem text as an optional last argument.

Modules (arrows point down; ``__init__`` exports the public names below):

- :mod:`~areal_cli.reward.math_grader.batch`: :func:`grade_many`, :func:`grade_batch`, :func:`grade_in_pool`
  (timeouts, the pool driver);
- :mod:`~areal_cli.reward.math_grader.grading`: :func:`grade`, :func:`is_equivalent`, :func:`equivalent`;
- :mod:`~areal_cli.reward.math_grader.extraction`: :func:`extract_answer` (think block, end of turn);
- :mod:`~areal_cli.reward.math_grader.stated`: :func:`stated_answer` (no box);
- :mod:`~areal_cli.reward.math_grader.spans`: math spans and masked text;
- :mod:`~areal_cli.reward.math_grader.boxes`: :func:`find_boxes`, :func:`extract_boxed`, joined boxes;
- :mod:`~areal_cli.reward.math_grader.restatement`: :func:`restates_problem`;
- :mod:`~areal_cli.reward.math_grader.choice`: :func:`choice_verdict` (multiple choice);
- :mod:`~areal_cli.reward.math_grader.comparison`: two bare answers, the percent policy, :func:`unit_asked`;
- :mod:`~areal_cli.reward.math_grader.normalize`: :func:`clean_answer`, :func:`normalize_answer_string`,
  :func:`normalize_gold`, :func:`plain_number`, :func:`decimal_comma_value`;
- :mod:`~areal_cli.reward.math_grader.verify`: math-verify, :func:`exact_value`, :func:`relation_as_set`.
"""

from areal_cli.reward.math_grader.batch import (
    GRADE_BATCH_FN,
    GRADE_FN,
    GradedAnswer,
    grade_batch,
    grade_in_pool,
    grade_many,
)
from areal_cli.reward.math_grader.boxes import Box, extract_boxed, find_boxes
from areal_cli.reward.math_grader.choice import choice_verdict
from areal_cli.reward.math_grader.comparison import unit_asked
from areal_cli.reward.math_grader.extraction import extract_answer, final_answer_region, strip_turn_end
from areal_cli.reward.math_grader.grading import equivalent, grade, is_equivalent
from areal_cli.reward.math_grader.normalize import (
    clean_answer,
    decimal_comma_value,
    normalize_answer_string,
    normalize_gold,
    plain_number,
)
from areal_cli.reward.math_grader.restatement import restates_problem
from areal_cli.reward.math_grader.stated import stated_answer
from areal_cli.reward.math_grader.verify import exact_value, relation_as_set

__all__ = [
    "GRADE_BATCH_FN",
    "GRADE_FN",
    "Box",
    "GradedAnswer",
    "choice_verdict",
    "clean_answer",
    "decimal_comma_value",
    "equivalent",
    "exact_value",
    "extract_answer",
    "extract_boxed",
    "final_answer_region",
    "find_boxes",
    "grade",
    "grade_batch",
    "grade_in_pool",
    "grade_many",
    "is_equivalent",
    "normalize_answer_string",
    "normalize_gold",
    "plain_number",
    "relation_as_set",
    "restates_problem",
    "stated_answer",
    "strip_turn_end",
    "unit_asked",
]
