"""`python -m kwrl` is the `kwrl` command."""

from kwrl.cli import app

app()
