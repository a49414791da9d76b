"""``python -m immersion`` runs the same CLI as the ``immersion`` console script."""

from .cli.main import main

if __name__ == "__main__":
    main(prog_name="immersion")
