"""Helpers of ``benchmarks/serve_vs_peers.py``: the peer servers it runs, their virtual
environments, the processes that host them and the load that measures them.

* :mod:`peers.catalog` -- each peer: its venv, its server script, its batching configuration;
* :mod:`peers.venvs` -- one virtual environment per peer, built with pip outside the repository;
* :mod:`peers.procs` -- start a server in a session of its own, wait for a real answer, stop
  every process of the session;
* :mod:`peers.load` -- ``wrk`` and the built-in Python client;
* ``peers/apps/`` -- the server scripts, one per peer, written against each peer's own API.
"""
