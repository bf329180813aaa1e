"""Alias of colibri.model.memory, kept so that `python -m colibri.memory
--readme-table ...` (the old spelling) still prints the README's table. New
code and docs use `python -m colibri.model.memory`."""
import sys

from colibri.model.memory import main

if __name__ == "__main__":
    sys.exit(main())
