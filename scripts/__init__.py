"""Repository scripts; `demo.py` is importable so a fuller demo can reuse its scenario."""
