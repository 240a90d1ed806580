"""pytest plugin of torchplace (registered through the ``pytest11`` entry point).

Placeholder until the guard lands: it registers nothing yet.
"""
