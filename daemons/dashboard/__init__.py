"""The dashboard: a read-only web view of the swarm (``swarm dashboard``), this project's SLM-UI.

Nodes and their state, contracts, tasks and taskrunners, rounds and leaders, and live training curves,
read from the ledger over the bus (``source.py``) and served by Starlette on uvicorn (``server.py``)
with a small page that needs no build step (``static/``: plain JavaScript and the vendored uPlot).
"""
