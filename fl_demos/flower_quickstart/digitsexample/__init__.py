"""digitsexample: Flower's quickstart-pytorch app, recreated on sklearn's bundled digits."""
