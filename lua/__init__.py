"""The stock scripts, installed as the package data ``gateway.lua`` (see pyproject.toml).

This file makes the directory a regular package, which the editable install
needs to map it under ``gateway``; the scripts are read with importlib.resources.
"""
