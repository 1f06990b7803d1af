"""``python -m ripieno`` is the ``ripieno`` command."""

from ripieno.framework.cli import main

if __name__ == "__main__":
    main()
