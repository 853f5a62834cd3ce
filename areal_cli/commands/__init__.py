"""The command line (top layer): the click group ``areal`` (:mod:`.main`) and each command, plus the error contract
every command follows (:mod:`.error_contract`: bad input is one line and a non-zero exit, never a traceback).

Commands parse and check their arguments, then call a job (:mod:`areal_cli.train_loop`, :mod:`areal_cli.eval`,
:mod:`areal_cli.reproduce`, :mod:`areal_cli.bench`, :mod:`areal_cli.launch`); nothing below imports this package
(``pyproject.toml``'s import contracts). Heavy modules (torch, megatron) are imported inside the command bodies,
so ``areal --help`` stays fast.
"""
