"""Stands in for an environment without click (typer >= 0.29 vendors it and no longer installs
it): tests put this folder first on PYTHONPATH, and `import click` fails as it would there."""

raise ModuleNotFoundError("No module named 'click'", name="click")
