"""The migrations, installed as the package data ``gateway.sql`` (see pyproject.toml).

This file makes the directory a regular package, which the editable install
needs to map it under ``gateway``; the SQL is read with importlib.resources.
"""
