"""A problem's tests (:class:`TestSuite`, as LiveCodeBench's ``input_output``) and the decoding of
LiveCodeBench's public and private test cases, whose pickles are loaded with every class refused."""

from __future__ import annotations

import base64
import io
import json
import math
import pickle
import zlib
from dataclasses import dataclass, field
from typing import Any

from areal_cli.reward.code_grader.tolerance import Tolerance, parse_tolerance

#: Largest decompressed LCB private-test payload accepted (the biggest real ones are tens of MiB).
MAX_PRIVATE_TESTS_BYTES = 512 << 20


@dataclass(frozen=True)
class TestSuite:
    """A problem's tests, as LiveCodeBench's ``input_output`` (JSON-able, picklable via :meth:`to_dict`).

    Attributes:
        inputs: stdin text per test (stdin mode) or, call-based, one JSON value per line (the arguments).
        outputs: expected stdout per test, or (call-based) the JSON of the expected return value.
        fn_name: None for stdin/stdout programs; else the function/method name (LCB ``metadata.func_name``).
        time_limit_s: the problem's own time limit per test, if the data set gives one.
        memory_bytes: the problem's own memory limit, if the data set gives one.
        tolerance: the numeric tolerance the statement declares (:func:`parse_tolerance`), or None (exact, as
            LiveCodeBench). Carried with the tests, as a judge's checker is part of a problem's test data: the
            loader that has the statement fills it (``areal_cli.eval.code_datasets``), and every caller of
            :func:`grade_code` (eval, regrade, the reward pool) applies it without needing the statement.
    """

    __test__ = False  # not a pytest test class

    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    fn_name: str | None = None
    time_limit_s: float | None = None
    memory_bytes: int | None = None
    tolerance: Tolerance | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.inputs, list) or not isinstance(self.outputs, list):
            raise ValueError("tests: 'inputs' and 'outputs' must be lists")
        if len(self.inputs) != len(self.outputs):
            raise ValueError(f"tests: {len(self.inputs)} inputs but {len(self.outputs)} outputs")
        if not all(isinstance(x, str) for x in self.inputs + self.outputs):
            raise ValueError("tests: every input and output must be a string")
        if self.fn_name is not None and (not isinstance(self.fn_name, str) or not self.fn_name.isidentifier()):
            raise ValueError(f"tests: fn_name must be a Python identifier or None, got {self.fn_name!r}")
        if self.time_limit_s is not None and not (
            isinstance(self.time_limit_s, (int, float)) and self.time_limit_s > 0 and math.isfinite(self.time_limit_s)
        ):
            raise ValueError(f"tests: time_limit_s must be a positive number, got {self.time_limit_s!r}")
        if self.memory_bytes is not None and not (isinstance(self.memory_bytes, int) and self.memory_bytes > 0):
            raise ValueError(f"tests: memory_bytes must be a positive int, got {self.memory_bytes!r}")
        if self.tolerance is not None and not isinstance(self.tolerance, Tolerance):
            raise ValueError(f"tests: tolerance must be a Tolerance or None, got {type(self.tolerance).__name__}")

    def to_dict(self) -> dict:
        """JSON-able form (what :func:`grade_code` takes and ``Problem.tests`` holds)."""
        return {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "fn_name": self.fn_name,
            "time_limit_s": self.time_limit_s,
            "memory_bytes": self.memory_bytes,
            "tolerance": None if self.tolerance is None else self.tolerance.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Any) -> "TestSuite":
        """Inverse of :meth:`to_dict`; ``fn_name`` "" is read as None (AReaL's convention); ``tolerance``
        may be absent (None).

        Raises:
            ValueError: not a dict, unknown keys, or invalid fields.
        """
        if not isinstance(d, dict):
            raise ValueError(f"tests must be a dict, got {type(d).__name__}")
        unknown = set(d) - {"inputs", "outputs", "fn_name", "time_limit_s", "memory_bytes", "tolerance"}
        if unknown:
            raise ValueError(f"tests: unknown keys {sorted(unknown)}")
        tol = d.get("tolerance")
        return cls(
            inputs=d.get("inputs", []),
            outputs=d.get("outputs", []),
            fn_name=d.get("fn_name") or None,
            time_limit_s=d.get("time_limit_s"),
            memory_bytes=d.get("memory_bytes"),
            tolerance=None if tol is None else Tolerance.from_dict(tol),
        )

    def call_arguments(self) -> list[list]:
        """Call-based inputs decoded as LCB does: ``[json.loads(line) for line in input.split("\\n")]``.

        Raises:
            ValueError: an input line or an expected output is not JSON (names the test).
        """
        args = []
        for i, text in enumerate(self.inputs):
            try:
                args.append([json.loads(line) for line in text.split("\n")])
            except ValueError as exc:
                raise ValueError(f"tests: call-based input {i} is not one JSON value per line: {exc}") from None
        for i, text in enumerate(self.outputs):
            try:
                json.loads(text)
            except ValueError as exc:
                raise ValueError(f"tests: call-based output {i} is not JSON: {exc}") from None
        return args


class _NoClassUnpickler(pickle.Unpickler):
    """Unpickler for data-only pickles: refuses every global (so no code can run while loading)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from test data")


def _decode_private(blob: str) -> list:
    """LCB private tests: plain JSON (early releases) or base64(zlib(pickle(json string)))."""
    if not blob or not blob.strip():
        return []
    try:
        value = json.loads(blob)
        if isinstance(value, list):
            return value
    except ValueError:
        pass
    try:
        d = zlib.decompressobj()
        raw = d.decompress(base64.b64decode(blob.encode("ascii"), validate=False), MAX_PRIVATE_TESTS_BYTES + 1)
        if len(raw) > MAX_PRIVATE_TESTS_BYTES or d.unconsumed_tail:
            raise ValueError(f"decompressed size exceeds {MAX_PRIVATE_TESTS_BYTES >> 20} MiB (zlib bomb?)")
        inner = _NoClassUnpickler(io.BytesIO(raw)).load()
    except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, UnicodeEncodeError, TypeError) as exc:
        raise ValueError(f"private tests: not JSON and not base64/zlib/pickle ({type(exc).__name__}: {exc})") from None
    if isinstance(inner, bytes):
        inner = inner.decode("utf-8")
    try:
        value = json.loads(inner) if isinstance(inner, str) else inner
    except ValueError as exc:
        raise ValueError(f"private tests: decoded blob is not JSON ({exc})") from None
    if not isinstance(value, list):
        raise ValueError(f"private tests: expected a list of tests, got {type(value).__name__}")
    return value


def decode_lcb_tests(public_json: str, private_blob: str, metadata_json: str, *,
                     statement: str | None = None) -> TestSuite:
    """LiveCodeBench's ``public_test_cases`` + ``private_test_cases`` + ``metadata`` -> :class:`TestSuite`.

    Public tests first, then private (as ``CodeGenerationProblem.get_evaluation_sample``); each test is
    ``{"input", "output", "testtype": "stdin"|"functional"}``; ``metadata.func_name`` names the function.
    ``statement`` (``question_content``), when given, is searched for a declared tolerance
    (:func:`parse_tolerance`, kept in ``TestSuite.tolerance``).

    Raises:
        ValueError: undecodable JSON/blob, malformed tests, mixed test types, a functional test without
            ``func_name``, call-based inputs that are not JSON, or no tests at all (the reason is in the message).
    """
    try:
        public = json.loads(public_json) if public_json and public_json.strip() else []
    except ValueError as exc:
        raise ValueError(f"public tests: not JSON ({exc})") from None
    if not isinstance(public, list):
        raise ValueError(f"public tests: expected a list, got {type(public).__name__}")
    private = _decode_private(private_blob)
    try:
        metadata = json.loads(metadata_json) if metadata_json and metadata_json.strip() else {}
    except ValueError as exc:
        raise ValueError(f"metadata: not JSON ({exc})") from None
    if not isinstance(metadata, dict):
        raise ValueError(f"metadata: expected an object, got {type(metadata).__name__}")
    inputs, outputs, types_seen = [], [], set()
    for where, tests in (("public", public), ("private", private)):
        for i, t in enumerate(tests):
            if not isinstance(t, dict) or not isinstance(t.get("input"), str) or not isinstance(t.get("output"), str):
                raise ValueError(f"{where} test {i}: expected {{input: str, output: str, testtype}}")
            types_seen.add(t.get("testtype", "stdin"))
            inputs.append(t["input"])
            outputs.append(t["output"])
    if not inputs:
        raise ValueError("no tests: public and private test cases are empty")
    if not types_seen <= {"stdin", "functional"} or len(types_seen) > 1:
        raise ValueError(f"tests: expected one testtype (stdin or functional), got {sorted(map(str, types_seen))}")
    fn_name = metadata.get("func_name") or None
    if types_seen == {"functional"} and not fn_name:
        raise ValueError("functional tests need metadata.func_name")
    suite = TestSuite(inputs=inputs, outputs=outputs, fn_name=fn_name if types_seen == {"functional"} else None,
                      tolerance=parse_tolerance(statement))
    if suite.fn_name is not None:
        suite.call_arguments()  # validate now: a bad problem is an error at load time, not a failed sample
    return suite
