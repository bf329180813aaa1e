"""Alias of colibri.buildsteps.cbuild, kept so that `python -m colibri.cbuild`
(the old spelling) still builds the C runtime on the host. New code and docs
use `python -m colibri.buildsteps.cbuild`."""
import sys

from colibri.buildsteps.cbuild import main

if __name__ == "__main__":
    sys.exit(main())
