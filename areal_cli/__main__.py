"""``python -m areal_cli``: the ``areal`` command (:func:`areal_cli.commands.main.main`)."""

from areal_cli.commands.main import main

if __name__ == "__main__":
    main(prog_name="areal")
