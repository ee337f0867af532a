"""``python -m refimpl.bench --help``."""
from .cli import main

main()
