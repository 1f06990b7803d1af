"""``python -m framework`` runs the ripieno CLI."""

from framework.cli import main

if __name__ == "__main__":
    main()
