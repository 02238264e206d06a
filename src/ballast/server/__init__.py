"""Serving glue, in one place: uvicorn's server and supervisor set up for Ballast
(serving.py), the guarded HTTP protocol with its header limits (protocol.py), the body
writer that is the app's seam to a request's connection (writer.py), and the small
aiohttp runner the simulator and the reference actor use (aioweb.py)."""
