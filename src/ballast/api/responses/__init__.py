"""The OpenAI Responses API: a bridge to chat completions for any upstream (request.py,
answer.py, stream.py), and pass-through to upstreams that speak it themselves."""
