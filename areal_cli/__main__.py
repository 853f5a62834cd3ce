"""``python -m areal_cli``: the ``areal`` command (:func:`areal_cli.cli.main`)."""

from areal_cli.cli import main

if __name__ == "__main__":
    main(prog_name="areal")
